"""Load an export dir's ONNX graphs into OpenVINO, in fp32, bf16 or int8-openvino (the same graphs ORT runs).

OpenVINO's CPU plugin reads the ONNX files as they are (external data in `onnx/weights.bin`) and
runs them at the precision given by `INFERENCE_PRECISION_HINT`: "f32", or "bf16", which uses AMX on
CPUs that have it and AVX512_BF16 on those that have only that (OpenVINO picks bf16 by itself on
such CPUs: the hint is always set, so "fp32" means fp32). No graph is written for bf16: the export
dir's fp32 graphs are the bf16 variant's graphs, and `export/parity.py` measures its accuracy.
int8-openvino is those graphs too, their products' constants made int8 as they are loaded (`int8_weights`,
per output channel) and their activations quantized per token at run time by the plugin (VNNI and AMX CPUs),
the rest at the bf16 hint: the accuracy gate measures it like the others (export/gate.py).

Weights: `read_model` maps `weights.bin` afresh for every graph, and each compiled bucket keeps its own
copy of every weight it does not convert (the word embeddings, the SSM kernels): six buckets of
bigs-mini-news at bf16 held 6 x ~90 MB. Given `weights` (the arrays ORT's sessions already run on,
export/onnx_runtime.py `map_weights`), each graph's constants are swapped for constants over that
memory before compiling (`share_weights`), so a model served by both runtimes, or by OpenVINO at
several buckets, holds its weights once; what a bucket adds is then only the products' weights
repacked at bf16 and its buffers (same model, six buckets, after one call each: 649 -> 414 MB
resident above the interpreter with the weights held once). Nothing refers to the file after loading, as for ORT (no SIGBUS if it is rewritten).

Each call runs on an infer request of its own thread (`threading.local`): the service's lanes call
from two threads, and one OpenVINO infer request must not run two inferences at once.

    compiled = load_compiled("export_dir", precision="bf16")   # {128: CompiledBucket, …}
    compiled = load_compiled("export_dir", weights=map_weights("export_dir", in_memory=True))  # one copy
    outputs = compiled[128].run(feeds)                        # {"logits": …, "embeddings": …}
    one = compile_graph("any.onnx", precision="bf16")         # one graph file by path (the benchmarks)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .manifest import Manifest, read_manifest
from .precisions import FP32, FP32_GRAPHS, VariantUnavailable, installed

# OpenVINO's hint for each precision this loader compiles. int8-openvino: the products' constants int8
# (`int8_weights`), the rest at the bf16 hint (f32 where the CPU has no bf16 units: OpenVINO's own choice)
INFERENCE_PRECISION = {FP32: "f32", "bf16": "bf16", "int8-openvino": "bf16"}
# int8-openvino: how many of a token's activations share one scale when the plugin quantizes them at run time.
# 256 (a product's whole row at d = 256, three groups of the FFN's 768) ran 1.2x faster than the plugin's 32 at 512
# and 4,096 tokens on the five defaults, every embedding cosine 0.9994 or more (docs/BENCHMARKS.md)
INT8_ACTIVATION_GROUP = 256


def openvino_available() -> bool:
    return installed("openvino")


@dataclass
class CompiledBucket:
    """One bucket's graph compiled by OpenVINO, with one infer request per calling thread."""

    compiled: object  # openvino.CompiledModel
    input_names: list[str]
    output_names: list[str]
    weights: object = None  # what the graph's shared constants point into, kept alive with it (`share_weights`)
    int8_shared: object = None  # likewise for its int8 constants (`SharedInt8Weights`)
    from_cache: bool = False  # read from OpenVINO's compiled-model cache (`load_compiled`'s cache_dir), not compiled
    _local: threading.local = field(default_factory=threading.local)

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        result = request.infer({name: feeds[name] for name in self.input_names})
        wanted = outputs or self.output_names
        by_name = {port.get_any_name(): value for port, value in result.items()}
        # copies: the request's output buffers are reused by its next inference
        return {name: np.array(by_name[name], dtype=np.float32, copy=True) for name in wanted}


def compile_config(
    precision: str,
    threads: int | None = None,
    dynamic_quantization_group: int | None = None,
    perf_count: bool = False,
) -> dict[str, str]:
    """The CPU plugin's properties for `precision` ("fp32" | "bf16" | "int8-openvino"): latency mode, one stream.
    `dynamic_quantization_group`: for a graph with int8 weights (`int8_weights`), how many of a token's activations
    share one scale when the plugin quantizes them at run time (VNNI and AMX CPUs); None: int8-openvino's
    `INT8_ACTIVATION_GROUP`, the plugin's default for the others. `perf_count`: the plugin times every node of
    each inference (bench/graph_profile.py `profile_openvino`); never on a served graph."""
    if precision not in INFERENCE_PRECISION:
        raise ValueError(f"OpenVINO runs fp32, bf16 or int8-openvino, not {precision!r}")
    if dynamic_quantization_group is None and precision == "int8-openvino":
        dynamic_quantization_group = INT8_ACTIVATION_GROUP
    config = {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISION[precision], "PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    if dynamic_quantization_group is not None:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(dynamic_quantization_group)
    if perf_count:
        config["PERF_COUNT"] = "YES"
    return config


# One graph built and compiled at a time in a process. A constant over a numpy array (`share_weights`) holds a
# Python reference that OpenVINO's C++ releases, taking the GIL, when the compile replaces the constant; two
# models loading on two threads (service/state.py, `load_workers`) hung in 1 start of 3-7, a thread stopped in
# `share_weights` and nothing running (py-spy): the GIL and OpenVINO's own locks taken in opposite orders, the
# likeliest reading. With this lock 20 of 20 starts were ready. The rest of a model's load (hashes, ONNX
# Runtime's sessions, the tokenizer) still runs beside another model's compile.
_BUILDING = threading.RLock()  # re-entered: build_graphs → build_graph


def share_weights(model, arrays: dict[str, np.ndarray]) -> int:
    """Swap each constant of `model` (an `openvino.Model` read from an export's graph) that is one of
    `arrays` (the export's weights by name: OpenVINO's ONNX reader names a constant after its
    initializer) for a constant over that array's memory, no copy. A constant whose shape or type
    differs is left as read. Returns how many were swapped."""
    import openvino as ov

    swapped = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        array = arrays.get(op.get_friendly_name())
        if array is None or tuple(array.shape) != tuple(op.get_output_shape(0)):
            continue
        if array.dtype != op.get_output_element_type(0).to_dtype():
            continue
        shared = ov.op.Constant(array, shared_memory=True)
        shared.set_friendly_name(op.get_friendly_name())
        op.output(0).replace(shared.output(0))
        swapped += 1
    return swapped


def nncf_available() -> bool:
    return installed("nncf")


def quantize_int8_nncf(src: str | Path, dst: str | Path, calibration: list[dict[str, np.ndarray]]) -> None:
    """Static int8 by NNCF on OpenVINO, written as OpenVINO IR (`dst` .xml, its weights in the .bin beside):
    the ONNX graph `src` read by OpenVINO, then `nncf.quantize` with NNCF's own settings for a transformer
    (SmoothQuant on the MatMuls, then min-max ranges per tensor and fast bias correction), calibrated on every
    row of `calibration` (bench/precision.py: the gate's real text at the bucket, the most favourable
    calibration). The library the int8 variant was weighed against (docs/DESIGN.md §1.3); measured by
    bench/precision.py, not written by `bigs export`."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(src))
    names = {port.get_any_name() for port in model.inputs}
    rows = [{k: v[r : r + 1] for k, v in feeds.items() if k in names} for feeds in calibration for r in range(len(feeds["input_ids"]))]  # fmt: skip
    quantized = nncf.quantize(model, nncf.Dataset(rows), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(rows))
    ov.save_model(quantized, str(dst))


def symmetric_int8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """`weight` as int8 values and one fp32 scale per slice along `axis` (the axis a product sums over, so one
    scale per output channel): weight ≈ values · scale. NNCF's INT8_SYM formula: each channel's value of largest
    magnitude maps to −128, so the channel spans the whole int8 range (scale = that value / −128, signed)."""
    extreme = np.take_along_axis(weight, np.expand_dims(np.abs(weight).argmax(axis=axis), axis), axis=axis)
    scale = (extreme / -128.0).astype(np.float32)
    scale[scale == 0] = 1.0  # an all-zero channel: any scale gives zeros
    values = np.clip(np.round(weight / scale), -128, 127).astype(np.int8)
    return values, scale


@dataclass
class SharedInt8Weights:
    """The int8 values and scales of a model's shared weights, made once and used by every bucket compiled at
    int8-openvino: each bucket's graph reads the same weights, so quantizing them per bucket would hold one int8
    copy of each per bucket (bigs-mini: 65 MB over its six buckets). Only constants named in `names` (the export's
    weights file, where one name is one content in every graph) are kept: any other may differ between graphs."""

    names: frozenset[str]
    by_weight: dict[tuple[str, int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def made_int8(self) -> set[str]:
        """The shared weights made int8 so far: the buckets compiled over them no longer read them in fp32."""
        return {name for name, _, _ in self.by_weight}

    def quantized(self, name: str, weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.names:
            return symmetric_int8(weight, axis)
        key = (name, axis, weight.shape)
        if key not in self.by_weight:
            self.by_weight[key] = symmetric_int8(weight, axis)
        return self.by_weight[key]


def int8_weights(model, shared: SharedInt8Weights | None = None) -> int:
    """Every constant operand of `model`'s MatMuls (an `openvino.Model`: the weight products' weights, and the
    SSM convolutions' constants on the left) replaced by int8 values times a per-output-channel scale
    (`symmetric_int8`), the pattern of NNCF's weight compression (`compress_weights`, INT8_SYM), which
    tests/test_bench_precision.py holds this to. OpenVINO's CPU plugin keeps such weights int8 and, on VNNI and
    AMX CPUs, quantizes each token's activations in groups at run time (`compile_config`'s
    `dynamic_quantization_group`), so the products run on int8 units with no calibration and no range shared
    across tokens; elsewhere it decompresses them. Done here rather than by NNCF, whose install brings scipy and
    scikit-learn: the formula is the three lines above, and the scales stay fp32 where NNCF stores fp16 (the
    SSM's carry constants reach 1e-30, below fp16's range). `shared`: the model's int8 weights already made
    for its other buckets, whose arrays the new constants then point into. Returns how many constants were replaced."""
    import openvino as ov
    import openvino.opset13 as ops

    shared = shared or SharedInt8Weights(frozenset())
    replaced = 0
    for node in list(model.get_ops()):
        if node.get_type_name() != "MatMul":
            continue
        transpose = node.get_attributes()
        for port in (0, 1):
            constant = node.input_value(port).get_node()
            if constant.get_type_name() != "Constant" or constant.get_output_element_type(0) != ov.Type.f32:
                continue
            weight = constant.get_data()
            if weight.ndim < 2:
                continue
            # the axis the product sums over: rows of the right operand, columns of the left, unless transposed
            transposed = transpose["transpose_b" if port == 1 else "transpose_a"]
            axis = (-2 if port == 1 else -1) if not transposed else (-1 if port == 1 else -2)
            name = constant.get_friendly_name()
            values, scale = shared.quantized(name, weight, axis)
            # a shared weight's constants over `shared`'s arrays (no copy per bucket), which the compiled model keeps
            # alive (`CompiledBucket`); any other's, a copy of their own
            over = name in shared.names
            int8, scale = ov.op.Constant(values, shared_memory=over), ov.op.Constant(scale, shared_memory=over)
            weight_f32 = ops.multiply(ops.convert(int8, ov.Type.f32), scale)
            node.input(port).replace_source_output(weight_f32.output(0))
            replaced += 1
    return replaced


@dataclass
class BuiltGraph:
    """One bucket's graph read and its constants set (`build_graph`), not compiled yet. Building reads the export's
    files; compiling (the plugin's work, ~90% of a bucket's load: 0.3 of 0.35 s for bigs-mini-news at 2,048, 2-core
    Xeon) reads none, so a service may build every bucket as it loads and compile some later (`compile`; the long
    lane's buckets, after ready: service/runtimes/openvino.py). Until then a constant not swapped for the shared
    weights' (none, where every weight's shape matches) keeps the weights file mapped."""

    core: object  # openvino.Core
    model: object  # openvino.Model, until compiled
    config: dict[str, str]  # `compile_config`'s
    input_names: list[str]
    weights: object = None  # as `CompiledBucket`'s
    int8_shared: object = None

    def compile(self) -> CompiledBucket:
        with _BUILDING:
            compiled = self.core.compile_model(self.model, "CPU", self.config)
            self.model = None  # what the compiled model needs of it, it holds
            return CompiledBucket(
                compiled,
                [port.get_any_name() for port in compiled.inputs],
                [port.get_any_name() for port in compiled.outputs],
                self.weights,
                self.int8_shared,
                bool(compiled.get_property("LOADED_FROM_CACHE")),
            )


def build_graph(
    path: str | Path,
    precision: str = "bf16",
    threads: int | None = None,
    core=None,
    weights=None,
    dynamic_quantization_group: int | None = None,
    int8_shared: SharedInt8Weights | None = None,
    perf_count: bool = False,
) -> BuiltGraph:
    """One ONNX graph file read by OpenVINO for its CPU plugin at `precision` (`compile_config`); its inputs and
    outputs are named as in the graph. `core`: an `openvino.Core` to reuse across calls. `weights`: the export's
    weights already in memory (export/onnx_runtime.py `MappedWeights`), which the graph's constants then point into
    (`share_weights`) instead of holding a copy of their own. At int8-openvino its products' constants are made int8
    (`int8_weights`), their activations quantized at run time in groups of `dynamic_quantization_group` (VNNI and
    AMX CPUs; `compile_config`); `int8_shared`: the int8 weights of the model's other buckets
    (`SharedInt8Weights`). `perf_count`: see `compile_config`."""
    import openvino as ov

    with _BUILDING:
        core = core or ov.Core()
        model = core.read_model(str(path))
        if weights is not None:
            share_weights(model, weights.arrays)
        if precision == "int8-openvino":
            int8_weights(model, int8_shared)
        return BuiltGraph(
            core,
            model,
            compile_config(precision, threads, dynamic_quantization_group, perf_count),
            [port.get_any_name() for port in model.inputs],
            weights,
            int8_shared if precision == "int8-openvino" else None,
        )


def compile_graph(path: str | Path, precision: str = "bf16", threads: int | None = None, **options) -> CompiledBucket:
    """`build_graph`, compiled now (the other options are its)."""
    return build_graph(path, precision, threads, **options).compile()


def load_compiled(export_dir: str | Path, precision: str = "bf16", **options) -> dict[int, CompiledBucket]:
    """{bucket: CompiledBucket}: `build_graphs` (its options: buckets, threads, manifest, weights, cache_dir), every
    bucket compiled now."""
    return {bucket: graph.compile() for bucket, graph in build_graphs(export_dir, precision, **options).items()}


def build_graphs(
    export_dir: str | Path,
    precision: str = "bf16",
    buckets: list[int] | None = None,
    threads: int | None = None,
    manifest: Manifest | None = None,
    weights=None,
    cache_dir: str | Path | None = None,
) -> dict[int, BuiltGraph]:
    """{bucket: BuiltGraph} of the export dir's fp32 ONNX graphs at `precision`, to compile (`BuiltGraph.compile`);
    with `weights` (its `map_weights`), every bucket's constants over that one copy (`build_graph`), and at
    int8-openvino each shared weight made int8 once for every bucket. `cache_dir`: a writable directory where
    OpenVINO keeps each compiled bucket and reads it back on the next load instead of compiling (its `CACHE_DIR`,
    keyed by the graph, its weights and the compile properties; a blob that cannot be written or read back is
    compiled instead). A bucket read back holds its own copy of the weights, from the blob: the service's caller
    keys the directory by CPU and export and weighs that cost (service/compiled_cache.py)."""
    import openvino as ov

    export_dir = Path(export_dir)
    manifest = manifest or read_manifest(export_dir)
    if manifest.onnx is None:
        raise ValueError(f"{export_dir} has no ONNX graphs (export with --formats onnx)")
    with _BUILDING:  # the Core too: nothing of OpenVINO's is made beside another model's build
        core = ov.Core()
        if cache_dir is not None:
            core.set_property({"CACHE_DIR": str(cache_dir)})
        int8_shared = SharedInt8Weights(frozenset(manifest.onnx.weights))
        return {
            bucket: build_graph(
                export_dir / manifest.onnx.graph(bucket, FP32_GRAPHS).file,
                precision,
                threads,
                core,
                weights,
                int8_shared=int8_shared,
            )
            for bucket in sorted(manifest.onnx.buckets)
            if buckets is None or bucket in buckets
        }


def load_variant(
    export_dir: str | Path, manifest: Manifest, precision: str, buckets: list[int] | None = None
) -> dict[int, CompiledBucket]:
    """`load_compiled` for the accuracy gate and the latency record (export/gate.py `variant_runner`): the buckets
    compiled at `precision` only where they run as that precision here, else `VariantUnavailable` saying why
    (a measurement would be of something else): OpenVINO not installed; int8-openvino on a CPU without int8 dot
    products, where OpenVINO decompresses the weights; bf16 where OpenVINO runs f32 instead."""
    from .cpu import cpu_description

    if not openvino_available():
        raise VariantUnavailable(f"OpenVINO is not installed (the runtime of {precision}: pip install openvino)")
    if precision == "int8-openvino":
        from .cpu import has_exact_int8_products

        if not has_exact_int8_products():
            raise VariantUnavailable(
                f"this CPU ({cpu_description()}) has no VNNI or AMX-INT8, so OpenVINO would decompress the int8 "
                "weights rather than run int8 products"
            )
    compiled = load_compiled(export_dir, precision, buckets=buckets, manifest=manifest)
    if precision == "bf16":
        effective = effective_precision(next(iter(compiled.values())))
        if effective != "bf16":
            raise VariantUnavailable(
                f"OpenVINO runs {effective} on this CPU ({cpu_description()}): no AVX512_BF16 or AMX"
            )
    return compiled


def effective_precision(bucket: CompiledBucket) -> str:
    """The precision the compiled graph really runs at ("fp32" | "bf16"): OpenVINO falls back to f32
    where the CPU has no bf16 instructions, whatever the hint."""
    hint = str(bucket.compiled.get_property("INFERENCE_PRECISION_HINT")).lower()
    return "bf16" if "bf16" in hint or "bfloat16" in hint else FP32
