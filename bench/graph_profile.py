"""Where an ONNX graph's time goes on ORT CPU, and its dense-FLOP floor measured in the same run.

    profile = profile_graph(session_factory, feeds, runs=3)   # ORT's own profiler, per node
    profile.by_category()                                     # {"weight MatMul": ms, "SSM MatMul": ms, …}
    floor_ms = dense_floor_ms(profile, variant="fp32")        # the same MatMuls, each alone in a graph

Every node of a graph falls in one category:

    weight MatMul     a MatMul/Gemm (or its int8 form) whose right operand is a constant: the dense layers
    attention MatMul  a MatMul of two activations (BERT's Q·Kᵀ and P·V)
    SSM MatMul        a MatMul whose LEFT operand is a constant (T·u, the chunked form's matrices)
    GELU              Gelu, BiasGelu, FastGelu, Erf
    elementwise       Add, Mul, Div, Sub, Where, Softmax, Cast, …
    layout            Transpose, Reshape, Slice, Split, Concat, Gather(Elements), Expand, …
    LayerNorm         LayerNormalization, SkipLayerNormalization
    quantize          DynamicQuantizeLinear and the like (int8 graphs)

The dense-FLOP floor of a graph is what its dense MatMuls (weight + attention) cost when nothing
else runs: every such node's shape, read from the profile, is timed alone in a one-node graph of
the same precision (fp32: MatMul; int8: the same graph through `quantize_dynamic`), in the same
process and run as the graph itself, and the medians are summed. A graph at its floor spends all
its time in those MatMuls; graph / floor is how far from it the rest of the graph keeps it.
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
    from export.onnx import quantize_int8

    quantize_int8(src, dst)


# How each precision's floor graph is made from the fp32 one-MatMul graph; a new variant whose
# MatMuls are made another way adds its transform here (one without an entry gets no floor).
FLOOR_TRANSFORMS: dict[str, Callable[[Path, Path], None] | None] = {"fp32": None, "int8": _quantize_int8}


def _dense_shape(node: NodeTime) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """(A shape, B shape, B constant) of a dense MatMul as fp32, from its profiled input shapes."""
    shapes = [s for s in node.input_shapes if s]
    if len(shapes) < 2:
        return None
    if node.op_type == "Gemm":  # 2-D, B maybe transposed: time it as A (M, K) @ B (K, N)
        (m, k), b = shapes[0], shapes[1]
        n = b[0] if b[0] != k else b[1]
        return (m, k), (k, n), True
    if node.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger"):
        return shapes[0], shapes[1], True
    return shapes[0], shapes[1], node.category == "weight MatMul"


def dense_floor_ms(
    profile: GraphProfile,
    variant: str,
    threads: int | None = None,
    repeats: int = 5,
    session_options: Callable[[], ort.SessionOptions] | None = None,
) -> float | None:
    """Σ over the graph's dense MatMuls of the median time of that MatMul alone, at `variant`'s precision.

    None when `variant` has no floor transform (FLOOR_TRANSFORMS)."""
    if variant not in FLOOR_TRANSFORMS:
        return None
    transform = FLOOR_TRANSFORMS[variant]
    counts: dict[tuple, int] = defaultdict(int)
    for node in profile.nodes:
        if node.category in DENSE_CATEGORIES:
            shape = _dense_shape(node)
            if shape is not None:
                counts[shape] += 1
    total = 0.0
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bigs-floor-") as tmp:
        for i, ((a_shape, b_shape, b_constant), count) in enumerate(sorted(counts.items())):
            path = Path(tmp) / f"{i}.onnx"
            _matmul_graph(a_shape, b_shape, b_constant, path)
            if transform is not None and b_constant:
                transform(path, Path(tmp) / f"{i}.q.onnx")
                path = Path(tmp) / f"{i}.q.onnx"
            options = session_options() if session_options else ort.SessionOptions()
            if threads:
                options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            feeds = {"a": rng.standard_normal(a_shape).astype(np.float32)}
            if not b_constant:
                feeds["b"] = rng.standard_normal(b_shape).astype(np.float32)
            session.run(None, feeds)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                session.run(None, feeds)
                times.append(1000 * (time.perf_counter() - start))
            total += count * statistics.median(times)
    return total


def dense_flops(profile: GraphProfile) -> float:
    """FLOPs (2·M·K·N) of the graph's dense MatMuls, from the profiled shapes."""
    flops = 0.0
    for node in profile.nodes:
        if node.category not in DENSE_CATEGORIES:
            continue
        shape = _dense_shape(node)
        if shape is None:
            continue
        a, b, _ = shape
        batch = int(np.prod(np.broadcast_shapes(a[:-2], b[:-2]))) if len(a) > 2 or len(b) > 2 else 1
        flops += 2.0 * batch * a[-2] * a[-1] * b[-1]
    return flops
