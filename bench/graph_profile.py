"""Where an ONNX graph's time goes on ORT CPU or inside OpenVINO, and its dense-FLOP floor measured in the same run.

    bigs bench graph-profile EXPORT_DIR --bucket 4096 --precision int8-openvino   # one bucket as it is served

    profile = profile_graph(session_factory, feeds, runs=3)   # ORT's own profiler, per node
    profile.by_category()                                     # {"weight MatMul": ms, "SSM MatMul": ms, …}
    floor = dense_floor(profile, "fp32")                      # the same MatMuls, each alone in a graph
    floor = dense_floor(profile, "bf16", graphs="fp32", runtime="openvino")  # … through OpenVINO at bf16

Every node of a graph falls in one category:

    weight MatMul     a MatMul/Gemm (or its int8 form) whose right operand is a constant: the dense layers
    attention MatMul  a MatMul of two activations (BERT's Q·Kᵀ and P·V), or a fused Attention node (both,
                      with the softmax; its floor is its two MatMuls)
    SSM MatMul        a MatMul whose LEFT operand is a constant (T·u, the chunked form's matrices)
    GELU              Gelu, BiasGelu, FastGelu, Erf
    elementwise       Add, Mul, Div, Sub, Where, Softmax, Cast, …
    layout            Transpose, Reshape, Slice, Split, Concat, Gather(Elements), Expand, …
    LayerNorm         LayerNormalization, SkipLayerNormalization
    quantize          DynamicQuantizeLinear and the like (int8 graphs)

The dense-FLOP floor of a graph is what its dense MatMuls (weight + attention) cost when nothing
else runs: every such node's shape, read from the profile, is timed alone in a one-node graph of
the same precision, on the same runtime, in the same process and run as the graph itself, and the
medians are summed. A graph at its floor spends all its time in those MatMuls; graph / floor is how
far from it the rest of the graph keeps it. A precision is described as the manifest serves it
(export/manifest.py `PrecisionVariant`): which graphs it runs and on which runtime, and the floor
follows both (`FLOOR_GRAPHS`, `FLOOR_RUNTIMES`):

    fp32   the fp32 graphs on ORT          one MatMul, on ORT
    int8   the int8 graphs on ORT          one MatMul through `quantize_dynamic`, on ORT
    bf16   the fp32 graphs on OpenVINO     one MatMul, compiled by OpenVINO at bf16

ORT's profiler cannot see inside OpenVINO, so for the floor a precision that runs another runtime is
profiled through ORT on the graphs it runs (bf16: the fp32 graph, the same nodes and shapes): its floor
has the right shapes. Where the time goes inside OpenVINO is `profile_openvino`'s: the plugin's own
per-node counters (PERF_COUNT), in the same categories, with the precision each node ran at (an
int8-openvino weight product runs as an int8 FullyConnected).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

MATMUL_OPS = {"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
GELU_OPS = {"Gelu", "BiasGelu", "FastGelu", "Erf"}
LAYOUT_OPS = {
    "Transpose", "Reshape", "Slice", "Split", "Concat", "Gather", "GatherElements", "Expand", "Unsqueeze",
    "Squeeze", "Shape", "Flatten", "Pad", "Identity",
}  # fmt: skip
NORM_OPS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization"}
QUANTIZE_OPS = {"DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear"}
CATEGORIES = (
    "weight MatMul", "attention MatMul", "SSM MatMul", "GELU", "elementwise", "layout", "LayerNorm", "quantize",
)  # fmt: skip
DENSE_CATEGORIES = ("weight MatMul", "attention MatMul")


@dataclass(frozen=True)
class NodeTime:
    """One node's median kernel time over the profiled runs."""

    name: str
    op_type: str
    category: str
    ms: float
    input_shapes: tuple[tuple[int, ...], ...]
    precision: str = ""  # what OpenVINO ran the node at (its runtime precision: i8, bf16, f32); "" from ORT


@dataclass
class GraphProfile:
    """Per-node kernel times of one graph (medians over runs) and the run's wall time."""

    nodes: list[NodeTime] = field(default_factory=list)
    wall_ms: float = 0.0  # median session.run time while profiling (profiling adds a little)

    def by_category(self) -> dict[str, float]:
        totals = dict.fromkeys(CATEGORIES, 0.0)
        for node in self.nodes:
            totals[node.category] += node.ms
        return totals

    def by_op_type(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for node in self.nodes:
            totals[node.op_type] += node.ms
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    @property
    def kernel_ms(self) -> float:
        return sum(node.ms for node in self.nodes)


def _constant_inputs(model: onnx.ModelProto) -> set[str]:
    names = {init.name for init in model.graph.initializer}
    names |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    return names


def categorize(node: onnx.NodeProto, constants: set[str]) -> str:
    op = node.op_type
    if op in MATMUL_OPS:
        left_constant = node.input[0] in constants
        right_constant = len(node.input) > 1 and node.input[1] in constants
        if left_constant:
            return "SSM MatMul"
        if right_constant or op == "DynamicQuantizeMatMul" or op == "MatMulIntegerToFloat":
            return "weight MatMul"
        if op == "MatMulInteger":  # its quantized weight is a constant unless both operands are activations
            return "weight MatMul" if node.input[1] in constants else "attention MatMul"
        return "attention MatMul"
    if op == "Attention":  # the fused attention (ONNX opset 23): its two MatMuls with the softmax between
        return "attention MatMul"
    if op in GELU_OPS:
        return "GELU"
    if op in LAYOUT_OPS:
        return "layout"
    if op in NORM_OPS:
        return "LayerNorm"
    if op in QUANTIZE_OPS:
        return "quantize"
    return "elementwise"


def profile_graph(
    make_session: Callable[[ort.SessionOptions], ort.InferenceSession],
    model_path: Path,
    feeds: dict[str, np.ndarray],
    runs: int = 3,
) -> GraphProfile:
    """Profile `runs` runs (after one warm-up) of the session `make_session(options)` builds with
    ORT's profiler on; `model_path` is its graph (for each node's operands)."""
    model = onnx.load(str(model_path), load_external_data=False)
    constants = _constant_inputs(model)
    by_name = {node.name: node for node in model.graph.node}
    with tempfile.TemporaryDirectory(prefix="bigs-profile-") as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = make_session(options)
        session.run(None, feeds)  # warm-up: its events are dropped below (first run of each node)
        walls = []
        for _ in range(runs):
            start = time.perf_counter()
            session.run(None, feeds)
            walls.append(1000 * (time.perf_counter() - start))
        events = json.loads(Path(session.end_profiling()).read_text())
    samples: dict[str, list[float]] = defaultdict(list)
    shapes: dict[str, tuple] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        samples[name].append(event["dur"] / 1000)
        shapes[name] = tuple(tuple(next(iter(shape.values()))) for shape in event["args"].get("input_type_shape", []))
    nodes = []
    for name, durations in samples.items():
        node = by_name.get(name)
        op_type = node.op_type if node is not None else name
        category = categorize(node, constants) if node is not None else "elementwise"
        # the warm-up's events come first: keep the last `runs` of each node
        nodes.append(NodeTime(name, op_type, category, statistics.median(durations[-runs:]), shapes[name]))
    return GraphProfile(nodes=nodes, wall_ms=statistics.median(walls))


# OpenVINO's CPU plugin names each executed node by the operation it came from; a weight product runs as a
# FullyConnected (FullyConnectedCompressed where its weight is int8), a product it left a MatMul
OPENVINO_CATEGORIES = {
    "FullyConnected": "weight MatMul", "FullyConnectedCompressed": "weight MatMul",
    "Gelu": "GELU", "MVN": "LayerNorm", "RMS": "LayerNorm", "LayerNorm": "LayerNorm",
    "Transpose": "layout", "Reorder": "layout", "Reshape": "layout", "Gather": "layout", "Concat": "layout",
    "Split": "layout", "StridedSlice": "layout", "Broadcast": "layout", "Squeeze": "layout", "Unsqueeze": "layout",
}  # fmt: skip


def _from_constants(op) -> bool:
    """Whether an executed node's value depends on no input of the graph (a weight, folded at compile time)."""
    kinds = {"Const": True, "Input": False, "Parameter": False}
    seen, todo = set(), [op]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        kind = str(node.get_rt_info()["layerType"].astype(str))
        if kind in kinds:
            if not kinds[kind]:
                return False
            continue
        todo.extend(node.input_value(i).get_node() for i in range(node.get_input_size()))
    return True


def profile_openvino(bucket, feeds: dict[str, np.ndarray], runs: int = 3) -> GraphProfile:
    """Where a graph's time goes inside OpenVINO: `runs` inferences (after one warm-up) of `bucket`, a
    `CompiledBucket` compiled with `perf_count` (export/openvino_runtime.py), each node's median time from the
    plugin's own counters. Categories as ORT's profile has them (`OPENVINO_CATEGORIES`; a MatMul is an SSM MatMul
    where its left operand is folded from constants, the chunked form's matrices, else an attention MatMul), so
    the two runtimes' profiles of one graph read side by side. The nodes' times can add up to a little more than
    the run's: the plugin runs independent branches (the SSM's two directions) at once."""
    request = bucket.compiled.create_infer_request()
    executed = {op.get_friendly_name(): op for op in bucket.compiled.get_runtime_model().get_ops()}
    request.infer(feeds)
    samples: dict[str, list[float]] = defaultdict(list)
    kinds: dict[str, tuple[str, str]] = {}
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        request.infer(feeds)
        walls.append(1000 * (time.perf_counter() - start))
        for info in request.profiling_info:
            ms = info.real_time.total_seconds() * 1000
            if ms > 0 or info.node_name in samples:
                samples[info.node_name].append(ms)
                kinds[info.node_name] = (info.node_type, info.exec_type)
    nodes = []
    for name, durations in samples.items():
        op_type, exec_type = kinds[name]
        category = OPENVINO_CATEGORIES.get(op_type, "elementwise")
        op = executed.get(name)
        if op_type == "MatMul":
            left_constant = op is not None and _from_constants(op.input_value(0).get_node())
            category = "SSM MatMul" if left_constant else "attention MatMul"
        precision = str(op.get_rt_info()["runtimePrecision"].astype(str)) if op is not None else exec_type
        nodes.append(NodeTime(name, op_type, category, statistics.median(durations), (), precision))
    return GraphProfile(nodes=nodes, wall_ms=statistics.median(walls))


# --------------------------------------------------------------------------------------------
# The floor: each dense MatMul alone
# --------------------------------------------------------------------------------------------


def _matmul_graph(a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_constant: bool, path: Path) -> None:
    """One MatMul; B a random constant (a weight) or a second input (attention)."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inputs, initializers = [a], []
    if b_constant:
        weight = np.random.default_rng(0).standard_normal(b_shape).astype(np.float32) * 0.02
        initializers.append(onnx.numpy_helper.from_array(weight, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)))
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "matmul", inputs, [y], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(model, str(path))


def _quantize_int8(src: Path, dst: Path) -> None:
    from export.int8_recipe import quantize_int8

    quantize_int8(src, dst)


# How each graph variant's one-MatMul graph is made from the fp32 one (applied when B is a constant
# weight); a graph variant made another way adds its transform here (one without an entry gets no floor).
FLOOR_GRAPHS: dict[str, Callable[[Path, Path], None] | None] = {"fp32": None, "int8": _quantize_int8}

Run = Callable[[dict[str, np.ndarray]], object]  # one call of a compiled graph on its feeds
INTEGER_MATMUL_OPS = {"MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}


def _ort_matmul(path: Path, precision: str, threads: int | None, options: ort.SessionOptions | None) -> tuple[Run, str]:
    """The one-MatMul graph as an ORT session (`options`: the export's session options). ORT runs the
    graph as written, whatever `precision` says: int8 where quantization made an integer MatMul of it,
    else fp32."""
    options = options or ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ops = {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}
    return (lambda feeds: session.run(None, feeds)), "int8" if ops & INTEGER_MATMUL_OPS else "fp32"


def _openvino_matmul(path: Path, precision: str, threads: int | None, options=None) -> tuple[Run, str]:
    """The one-MatMul graph compiled by OpenVINO's CPU plugin at `precision`, as the service compiles
    its graphs (export/openvino_runtime.py); `options` (ORT's) do not apply."""
    from export.openvino_runtime import compile_graph, effective_precision

    compiled = compile_graph(path, precision, threads)
    return compiled.run, effective_precision(compiled)  # what the plugin really runs: bf16, or f32 without it


# Each runtime a precision is served on: (graph path, precision, threads, ORT session options) →
# (one call on feeds, the precision the runtime says it runs at).
FLOOR_RUNTIMES: dict[str, Callable[..., tuple[Run, str]]] = {"onnxruntime": _ort_matmul, "openvino": _openvino_matmul}


Shape = tuple[int, ...]


def _dense_shapes(node: NodeTime) -> list[tuple[Shape, Shape, bool]]:
    """[(A shape, B shape, B constant)] of the dense MatMuls a node computes, as fp32, from its profiled
    input shapes: one for a MatMul or Gemm, two for a fused `Attention` (Q·Kᵀ and P·V), none if unknown."""
    shapes = [s for s in node.input_shapes if s]
    if len(shapes) < 2:
        return []
    if node.op_type == "Attention":  # Q, K, V as (B, heads, L, head size): the 4-D form the export writes
        q, k, v = shapes[:3]
        if not len(q) == len(k) == len(v) == 4:
            return []
        return [(q, (*k[:2], k[3], k[2]), False), ((*q[:3], k[2]), v, False)]
    if node.op_type == "Gemm":  # 2-D, B maybe transposed: time it as A (M, K) @ B (K, N)
        (m, k), b = shapes[0], shapes[1]
        n = b[0] if b[0] != k else b[1]
        return [((m, k), (k, n), True)]
    if node.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger"):
        return [(shapes[0], shapes[1], True)]
    return [(shapes[0], shapes[1], node.category == "weight MatMul")]


@dataclass(frozen=True)
class DenseFloor:
    """A graph's dense-FLOP floor: Σ over its dense MatMuls of the median time of each alone."""

    ms: float
    matmuls: int  # dense MatMuls of the graph counted (a fused Attention node counts two)
    # the precisions the floor's MatMuls ran at, as the runtime has them: OpenVINO's compiled precision,
    # ORT's graph (an int8 graph's MatMuls of two activations may stay fp32)
    runs_at: frozenset[str]


def dense_floor(
    profile: GraphProfile,
    precision: str,
    graphs: str | None = None,
    runtime: str = "onnxruntime",
    threads: int | None = None,
    repeats: int = 5,
    session_options: Callable[[], ort.SessionOptions] | None = None,
) -> DenseFloor | None:
    """The floor of `profile`'s graph at `precision`, served as the `graphs` files (default: the
    precision's own) on `runtime` ("onnxruntime" | "openvino"). None when no floor graph is known
    for `graphs` (FLOOR_GRAPHS). `session_options`: ORT's, for the ORT runtime."""
    graphs = graphs or precision
    if graphs not in FLOOR_GRAPHS:
        return None
    transform, make_run = FLOOR_GRAPHS[graphs], FLOOR_RUNTIMES[runtime]
    counts: dict[tuple, int] = defaultdict(int)
    for node in profile.nodes:
        if node.category in DENSE_CATEGORIES:
            for shape in _dense_shapes(node):
                counts[shape] += 1
    total, runs_at = 0.0, set[str]()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bigs-floor-") as tmp:
        for i, ((a_shape, b_shape, b_constant), count) in enumerate(sorted(counts.items())):
            path = Path(tmp) / f"{i}.onnx"
            _matmul_graph(a_shape, b_shape, b_constant, path)
            if transform is not None and b_constant:
                transform(path, Path(tmp) / f"{i}.q.onnx")
                path = Path(tmp) / f"{i}.q.onnx"
            run, ran_at = make_run(path, precision, threads, session_options() if session_options else None)
            runs_at.add(ran_at)
            feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
            if not b_constant:
                feeds["b"] = rng.standard_normal(b_shape).astype(np.float32)
            run(feeds)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run(feeds)
                times.append(1000 * (time.perf_counter() - start))
            total += count * statistics.median(times)
    return DenseFloor(ms=total, matmuls=sum(counts.values()), runs_at=frozenset(runs_at))


def dense_flops(profile: GraphProfile) -> float:
    """FLOPs (2·M·K·N) of the graph's dense MatMuls, from the profiled shapes."""
    flops = 0.0
    for node in profile.nodes:
        if node.category not in DENSE_CATEGORIES:
            continue
        for a, b, _ in _dense_shapes(node):
            batch = int(np.prod(np.broadcast_shapes(a[:-2], b[:-2]))) if len(a) > 2 or len(b) > 2 else 1
            flops += 2.0 * batch * a[-2] * a[-1] * b[-1]
    return flops


# --------------------------------------------------------------------------------------------
# bigs bench graph-profile: one bucket of an export, at one precision, as it is served
# --------------------------------------------------------------------------------------------


def profile_export(export_dir: Path, bucket: int, precision: str, runs: int = 3) -> GraphProfile:
    """Profile one bucket of an export at `precision` on the runtime that serves it: fp32 and int8 through
    ORT's profiler (at the graph optimisation level the manifest records), bf16 and int8-openvino through
    OpenVINO's counters."""
    from bench.precision import feeds_for
    from export.manifest import read_manifest
    from export.onnx_runtime import session_options
    from export.openvino_runtime import compile_graph
    from export.precisions import precision_spec

    manifest = read_manifest(export_dir)
    spec = precision_spec(precision)
    graph = manifest.onnx.graph(bucket, spec.graphs)
    feeds = feeds_for(graph.input_names, bucket, 1, manifest.model.vocab_size)
    path = export_dir / graph.file
    if spec.runtime == "onnxruntime":
        served = session_options(manifest)

        def make_session(options: ort.SessionOptions) -> ort.InferenceSession:
            options.graph_optimization_level = served.graph_optimization_level
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        return profile_graph(make_session, path, feeds, runs)
    return profile_openvino(compile_graph(path, precision, perf_count=True), feeds, runs)


def markdown(profile: GraphProfile, title: str) -> str:
    """The profile as two tables: by category, and by operation with the precision each ran at."""
    lines = [f"{title}: {profile.wall_ms:.1f} ms a run, {profile.kernel_ms:.1f} ms in its nodes", ""]
    lines += ["| category | ms | share |", "|---|---:|---:|"]
    for category, ms in profile.by_category().items():
        if ms:
            lines.append(f"| {category} | {ms:.2f} | {ms / profile.kernel_ms:.0%} |")
    ran_at: dict[str, set[str]] = defaultdict(set)
    count: dict[str, int] = defaultdict(int)
    for node in profile.nodes:
        ran_at[node.op_type].add(node.precision)
        count[node.op_type] += 1
    lines += ["", "| operation | ms | nodes | ran at |", "|---|---:|---:|---|"]
    for op_type, ms in profile.by_op_type().items():
        precisions = ", ".join(sorted(ran_at[op_type] - {""})) or "—"  # "" where ORT profiled it
        lines.append(f"| {op_type} | {ms:.2f} | {count[op_type]} | {precisions} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from export.precisions import FP32, NAMES

    parser = argparse.ArgumentParser(
        prog="bigs bench graph-profile",
        description="Where one bucket's time goes at one precision, on the runtime that serves it (per-node "
        "counters of ORT's profiler or of OpenVINO's plugin), by category and by operation",
    )
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--bucket", type=int, default=512)
    parser.add_argument("--precision", default=FP32, choices=NAMES)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    from service.precision_policy import cpu_model_name

    profile = profile_export(args.export_dir, args.bucket, args.precision, args.runs)
    title = f"{args.export_dir.name}, {args.bucket:,} tokens, {args.precision}, batch 1, median of {args.runs} ({cpu_model_name()})"
    print(markdown(profile, title))


if __name__ == "__main__":
    main()
