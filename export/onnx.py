"""torch → ONNX, one graph per length bucket, all graphs over ONE shared weights file.

Per bucket (fixed L, dynamic batch):
  1. `torch.onnx.export(dynamo=True, opset 20)` of the head wrapper with the SSMs frozen for L
     (export/modules.py). The dynamo exporter gives a clean graph: native Gelu and
     LayerNormalization, MatMul/Gemm on the weights, no Constant/Identity clutter. (The TorchScript
     exporter, dynamo=False, also works but decomposes GELU into Erf arithmetic and scatters Constant
     and Identity nodes.) Complex tensors never reach it: the kernels are precomputed constants.
     The buckets beyond those the int8 search gates at are traced meanwhile in a child process
     (export/tracing.py): tracing is single-threaded, and the search beside it leaves a core idle.
  2. ORT offline graph optimisation (`ORT_ENABLE_EXTENDED`: constant folding, bias-GELU, skip-
     LayerNorm, MatMul fusions), saved. The service then loads with optimisation disabled
     (`SESSION_OPTIONS`), so no per-session transform can make private copies of the weights.
  3. Optionally (precision int8) `quantize_dynamic`: MatMul/Gemm weights int8 per output channel,
     the SSM convolutions kept fp32 by name unless the int8 search's gate took them too
     (export/int8_search.py); then optimised again. (bf16 needs no graph of its own:
     OpenVINO runs these fp32 graphs at bf16, export/openvino_runtime.py.)

Every initializer of at least `MIN_SHARED_BYTES` is moved into `onnx/weights.bin`, deduplicated
by content across buckets and variants, renamed to one name per content ("shared/…") and aligned
(64 bytes; a page from 1 MiB). Each `onnx/<bucket>.onnx` is small and refers to it as ONNX external
data, so the dir loads with any ONNX tool; `export/onnx_runtime.py` instead maps the file once and
hands the same buffers to every bucket's session (`SessionOptions.add_initializer`), so the weights
are in memory once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper

from .heads import MASK_POSITIONS
from .int8_graph import biases_into_products, fold_smoothing
from .manifest import OnnxSection
from .modules import Formulation, SentenceEmbedding, export_wrapper, formulation_for, frozen_ssms

ONNX_OPSET = 20  # Gelu is a native op from opset 20
# Models with attention routing (docs/DESIGN.md §2.7; ALiBi's too, §2.8): from opset 23 the exporter writes
# scaled_dot_product_attention as one ONNX `Attention` node, one kernel in ONNX Runtime (§3.7).
ATTENTION_OPSET = 23
ATTENTION_ROUTINGS = ("attention", "alibi")
WEIGHTS_FILE = "weights.bin"
MIN_SHARED_BYTES = 1024  # smaller initializers stay inside each graph
ALIGN = 64  # every tensor starts 64-byte aligned (SIMD loads straight from the mapped file)
PAGE = 4096  # tensors of PAGE_ALIGN_BYTES or more start on a page (ORT may memory-map those itself)
PAGE_ALIGN_BYTES = 1 << 20

# The session options the exported graphs are meant for (recorded in the manifest). The graphs are
# already optimised at ORT_ENABLE_EXTENDED; optimising again at load could only re-create weights
# per session. MLAS pre-packing of MatMul weights would make a packed copy of every weight per
# session (the Python API has no shared pre-packed container), so it is off.
SESSION_OPTIONS = {
    "graph_optimization_level": "ORT_DISABLE_ALL",
    "config_entries": {"session.disable_prepacking": "1"},
}
OFFLINE_OPTIMIZATION_LEVEL = "ORT_ENABLE_EXTENDED"


# --------------------------------------------------------------------------------------------
# 1. torch → ONNX
# --------------------------------------------------------------------------------------------


def opset_for(model: torch.nn.Module) -> int:
    return ATTENTION_OPSET if getattr(model.config, "routing", "ssm") in ATTENTION_ROUTINGS else ONNX_OPSET


def example_inputs(wrapper: torch.nn.Module, length: int, batch: int = 2, positions: int = 3) -> tuple:
    ids = torch.ones(batch, length, dtype=torch.long)
    mask = torch.ones(batch, length, dtype=torch.long)
    types = torch.zeros(batch, length, dtype=torch.long)
    if MASK_POSITIONS in wrapper.input_names:
        return ids, mask, types, torch.zeros(batch, positions, dtype=torch.long)
    return ids, mask, types


def torch_to_onnx(
    model: torch.nn.Module,
    length: int,
    formulation: Formulation,
    path: Path,
    embedding: SentenceEmbedding | None = None,
) -> None:
    """Export `model` (BiGSForMaskedLM / BiGSForSequenceClassification) for sequence length `length`;
    `embedding` is the dir's embeddings head (its Dense, if any), the plain mean by default."""
    with frozen_ssms(model, length, formulation):
        wrapper = export_wrapper(model, embedding)
        dynamo_export(wrapper, example_inputs(wrapper, length), path, opset_for(model))


def dynamo_export(wrapper: torch.nn.Module, args: tuple, path: Path, opset: int = ONNX_OPSET) -> None:
    """`torch.onnx.export` (dynamo, at `opset`) of a head wrapper (its `input_names`/`output_names`),
    batch dynamic, weights as external data. Also how the benchmark exports its BERT baseline, so both
    go through the same exporter."""
    batch = torch.export.Dim("batch")
    dynamic = {name: {0: batch} for name in wrapper.input_names}
    if MASK_POSITIONS in dynamic:
        dynamic[MASK_POSITIONS][1] = torch.export.Dim("positions")
    progress = io.StringIO()  # the exporter prints its steps to stdout even with verbose=False
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(progress):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            args,
            str(path),
            dynamo=True,
            opset_version=opset,
            input_names=list(wrapper.input_names),
            output_names=list(wrapper.output_names),
            dynamic_shapes=dynamic,
            external_data=True,
            optimize=True,
            verbose=False,
        )


# --------------------------------------------------------------------------------------------
# 2. ORT offline optimisation, 3. int8
# --------------------------------------------------------------------------------------------


# ORT's own GeluApproximation transformer (a session config entry): Gelu and BiasGelu become FastGelu,
# GELU's tanh form, x·σ(1.5958·(x + 0.0447·x³)), which MLAS computes faster than erf. Within 1e-3 of the
# erf form; never applied to an fp32 graph (fp32 is the exact model).
GELU_APPROXIMATION_ENTRY = "optimization.enable_gelu_approximation"


def ort_optimize(src: Path, dst: Path, gelu_approximation: bool = False) -> None:
    """Write `src` optimised at `OFFLINE_OPTIMIZATION_LEVEL` to `dst` (weights in `dst`.data); with
    `gelu_approximation`, GELU in its tanh form (`GELU_APPROXIMATION_ENTRY`)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OFFLINE_OPTIMIZATION_LEVEL)
    options.optimized_model_filepath = str(dst)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.add_session_config_entry("session.disable_prepacking", "1")
    if gelu_approximation:
        options.add_session_config_entry(GELU_APPROXIMATION_ENTRY, "1")
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def constant_left_matmuls(path: Path) -> list[str]:
    """The MatMul nodes whose left operand is a constant: the frozen SSM convolutions (T·u, and the
    chunked form's intra/to_state/carry/read products, export/modules.py). They are not weights:
    their constants are the long-range kernel, whose small far-off entries int8 would round to zero,
    so they are named explicitly to stay fp32 (besides `MatMulConstBOnly`, which skips them too). Measured
    since (docs/BENCHMARKS.md, "Two levers"): in int8 they kept bigs-mini-news's cosine and cost one
    classification at 512; `Int8Recipe.ssm_convolutions` quantizes them where the gate keeps it."""
    model = onnx.load(str(path), load_external_data=False)
    constants = {init.name for init in model.graph.initializer}
    constants |= {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[0] in constants]


# Quantized: the weight products only. Embedding lookups (Gather), LayerNorm, softmax, the SSM
# convolutions (constant-left MatMuls) and every elementwise op stay fp32; so do the Gemms (the heads,
# the MLM decoder, the pooler, a 2_Dense), which ORT's dynamic quantization does not take.
QUANTIZED_OP_TYPES = ["MatMul", "Gemm"]


@dataclass(frozen=True)
class Int8Recipe:
    """How `bigs export` quantizes each bucket's graph (export/int8_search.py decides `fp32_weights`).

    Dynamic int8 (ORT `quantize_dynamic`: MatMulInteger; activations quantized per call, uint8, one
    range per tensor): the fastest int8 on ORT CPU (docs/DESIGN.md §4.5). Weights int8 per output
    channel; `reduce_range`: 7-bit weights, so that a product of a uint8 activation and a weight pair
    summed in int16 cannot saturate on a CPU without VNNI (AVX2's vpmaddubsw): then the integer products
    are exact on every x86 kernel (AVX2, AVX-512, VNNI, AMX) and the accuracy gate measured on one CPU
    holds on the others. `fp32_weights`: the weight products left in fp32, by their weight tensor's name
    in onnx/weights.bin (the same tensor in every bucket's graph, whatever the node is called there)."""

    per_channel: bool = True
    reduce_range: bool = True
    fp32_weights: frozenset[str] = frozenset()
    # SmoothQuant-style scaling (export/int8_search.py `smoothing_factors`): weight name → s, one factor per
    # input channel; the product x·W becomes (x / s)·(s W), so that the activation's outlier channels,
    # which set its one per-tensor range, are shrunk before quantizing and the weights take the scale
    smoothing: dict[str, np.ndarray] = field(default_factory=dict, compare=False)
    # Levers on the fp32 remainder, tried by the search once the weight products are settled (export/
    # int8_search.py, steps 4 and 5) and kept where the gate passes with them: the SSM convolutions in int8
    # too (`constant_left_matmuls`: the Toeplitz T up to 512 tokens, the chunked form's constants beyond;
    # ORT quantizes each constant as uint8, one range, and u per call: MatMulIntegerToFloat), and GELU in
    # its tanh form where the graph is optimised (`ort_optimize`).
    ssm_convolutions: bool = False
    gelu_approximation: bool = False
    # With `ssm_convolutions`, each convolution's input quantized signed (`signed_convolution_inputs`): the same
    # answers, on the u8·s8 kernels instead of u8·u8. Its constants keep 8 bits, so a pair of products can
    # exceed int16: exact only on a CPU that sums in int32 (export/cpu.py `has_exact_int8_products`), which is
    # where export takes it (export/build.py); elsewhere ORT's unsigned form, exact on every kernel.
    ssm_signed_inputs: bool = False
    # Two exact rewrites that take fp32 passes off the graph (export/int8_graph.py), the same answers: each GELU
    # after an int8 product reads the product with its bias added (`biases_into_products`), and a smoothing
    # factor goes into the LayerNorm or the gate's linear before it where one can take it (`fold_smoothing`).
    # False only to measure what they buy (bench/precision.py) or to rebuild a dir written before them.
    biases_in_products: bool = True
    smoothing_folded: bool = True

    @property
    def weight_bits(self) -> int:
        return 7 if self.reduce_range else 8

    def without_levers(self) -> Int8Recipe:
        """The same weight products, smoothing and bits, with neither lever: what a bucket whose own gate
        refused the levers is written with (export/int8_search.py `Int8Plan`)."""
        return replace(self, ssm_convolutions=False, gelu_approximation=False)


def weight_products(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The MatMul nodes whose right operand is a weight (an initializer): what int8 may quantize.
    Not the SSM convolutions (their constant is the left operand, `constant_left_matmuls`)."""
    constants = {init.name for init in model.graph.initializer}
    return [
        n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in constants and n.input[0] not in constants
    ]


SMOOTHED_SUFFIX = ".smoothed"  # a smoothed product's scaled weight: its own tensor, the fp32 graph's is untouched


def smooth_products(
    src: Path, dst: Path, smoothing: dict[str, np.ndarray], skip: frozenset[str], fold: bool = True
) -> int:
    """The graph `src` with each weight product whose weight is in `smoothing` (and not in `skip`) computed
    as (x / s)·(s W): a Mul by 1/s on its input, and its weight scaled by s under a name of its own
    (`SMOOTHED_SUFFIX`); with `fold`, each 1/s that a LayerNorm or a gate's linear before it can take goes
    there instead of into its Mul (export/int8_graph.py `fold_smoothing`). The same products in fp32; written to
    `dst` with its weights beside it. Returns how many products were smoothed."""
    model = onnx.load(str(src), load_external_data=True)
    initializers = {init.name: init for init in model.graph.initializer}
    products = {n.name for n in weight_products(model)}
    nodes, smoothed = [], 0
    for node in model.graph.node:
        weight = node.input[1] if node.name in products else None
        if weight is None or weight not in smoothing or weight in skip:
            nodes.append(node)
            continue
        factors = smoothing[weight].astype(np.float32)
        scaled = numpy_helper.to_array(initializers[weight]) * factors[:, None]
        inverse = f"{weight}{SMOOTHED_SUFFIX}.inverse_scale"
        for name, array in ((weight + SMOOTHED_SUFFIX, scaled), (inverse, 1.0 / factors)):
            if name not in initializers:
                initializers[name] = numpy_helper.from_array(array.astype(np.float32), name)
                model.graph.initializer.append(initializers[name])
        divided = f"{node.name}{SMOOTHED_SUFFIX}.input"
        nodes.append(
            onnx.helper.make_node("Mul", [node.input[0], inverse], [divided], name=f"{node.name}{SMOOTHED_SUFFIX}")
        )
        node.input[0], node.input[1] = divided, weight + SMOOTHED_SUFFIX
        nodes.append(node)
        smoothed += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if fold:
        is_smoothing = lambda n: n.op_type == "Mul" and n.name.endswith(SMOOTHED_SUFFIX)  # noqa: E731
        fold_smoothing(model, initializers, is_smoothing, skip)
    onnx.save(model, str(dst), save_as_external_data=True, location=f"{dst.name}.weights")
    return smoothed


def quantize_int8(src: Path, dst: Path, recipe: Int8Recipe | None = None, per_channel: bool | None = None) -> None:
    """Dynamic int8 of the graph `src` by `recipe` (default: every weight product, per channel, 7-bit
    weights); `per_channel` overrides the recipe's (the benchmarks' per-tensor column). With the
    recipe's `smoothing`, the products it names (and does not leave in fp32) are smoothed first
    (`smooth_products`)."""
    recipe = recipe or Int8Recipe()
    with tempfile.TemporaryDirectory(prefix="bigs-smooth-") as tmp:
        if recipe.smoothing:
            smoothed = Path(tmp) / "smoothed.onnx"
            smooth_products(src, smoothed, recipe.smoothing, recipe.fp32_weights, recipe.smoothing_folded)
            src = smoothed
        _quantize_dynamic(src, dst, recipe, per_channel)


def write_int8_graph(src: Path, dst: Path, recipe: Int8Recipe) -> None:
    """The int8 graph of the fp32 graph `src` as `bigs export` serves it, written to `dst` (weights in
    `dst`.data): quantized by `recipe` (`quantize_int8`), then optimised offline like every graph, with GELU in
    its tanh form where the recipe asks for it (`ort_optimize`), then each GELU's bias moved into the int8
    product before it (export/int8_graph.py `biases_into_products`). What the export writes, what the int8
    search gates and what `bigs bench precision` times are this one function's graph."""
    with tempfile.TemporaryDirectory(prefix="bigs-int8-") as tmp:
        raw = Path(tmp) / f"{dst.stem}.raw.onnx"
        quantize_int8(src, raw, recipe)
        ort_optimize(raw, dst, recipe.gelu_approximation)
    if recipe.biases_in_products:
        biases_into_products(dst)


def copy_graph(src: Path, dst: Path) -> None:
    """The graph `src` (its weights in external data beside it) written to `dst`, weights in `dst`.data."""
    onnx.save(onnx.load(str(src)), str(dst), save_as_external_data=True, location=f"{dst.name}.data")


def _quantize_dynamic(src: Path, dst: Path, recipe: Int8Recipe, per_channel: bool | None) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src), load_external_data=False)
    kept = [n.name for n in weight_products(model) if n.input[1] in recipe.fp32_weights]
    if recipe.ssm_convolutions:  # MatMulConstBOnly off below: only the products named here stay fp32
        constants = {init.name for init in model.graph.initializer}
        convolutions = [n.name for n in model.graph.node if n.op_type == "MatMul" and not constants & set(n.input)]
    else:
        convolutions = constant_left_matmuls(src)
    quantize_dynamic(
        str(src),
        str(dst),
        weight_type=QuantType.QInt8,
        per_channel=recipe.per_channel if per_channel is None else per_channel,
        reduce_range=recipe.reduce_range,
        op_types_to_quantize=QUANTIZED_OP_TYPES,
        nodes_to_exclude=convolutions + kept,
        use_external_data_format=True,
        # a constant LEFT operand is quantized only where the recipe takes the SSM convolutions
        extra_options={"MatMulConstBOnly": not recipe.ssm_convolutions},
    )
    if recipe.ssm_convolutions and recipe.ssm_signed_inputs:
        signed_convolution_inputs(dst)


# The byte that `signed_convolution_inputs` XORs with: flipping a uint8's top bit and reading it as int8 is v − 128
_SIGN_BIT = "signed_input.sign_bit"


def signed_convolution_inputs(path: Path) -> int:
    """Rewrite, in the quantized graph at `path` (its weights stay where they are), each SSM convolution's input
    quantized per call to uint8 into the same values as int8; returns how many inputs were rewritten.

    ORT's dynamic quantization makes every activation uint8 (`DynamicQuantizeLinear`). A convolution's constant
    (the Toeplitz T, the chunked form's matrices) is its LEFT operand, also uint8, so the product is u8·u8, which
    MLAS multiplies in 16 bits, at about half the rate of a weight product's u8·s8 (docs/DESIGN.md §1.3). So the
    input is quantized again beside ORT's quantizer, with its scale and its zero point less 128 (the byte's top bit
    flipped, then read as int8: BitwiseXor, Cast), as int8 (QuantizeLinear): each value is the uint8 one less 128,
    so every integer product, and every answer, is the one ORT's own form computes, and the product runs on the
    u8·s8 kernels. (Flipping every value's top bit instead ran slower: ORT's BitwiseXor is not vectorized.) The
    constant keeps its 8 bits: exact where the CPU sums products in int32 (VNNI's vpdpbusd, AMX), not on AVX2's
    vpmaddubsw (`Int8Recipe.ssm_signed_inputs`). Only an input whose every use is the right operand of a product
    with a constant left one is rewritten."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            users.setdefault(name, []).append((node, position))

    def convolution_input(name: str, position: int) -> bool:
        """Whether every use of `name` is input `position` of an integer product whose left operand is constant."""
        uses = users.get(name, [])
        return bool(uses) and all(
            n.op_type == "MatMulInteger" and at == position and n.input[0] in constants for n, at in uses
        )

    make = onnx.helper.make_node
    nodes, rewritten = [], 0
    for node in graph.node:
        nodes.append(node)
        quantized, scale, zero_point = node.output if node.op_type == "DynamicQuantizeLinear" else ("", "", "")
        if not quantized or not (convolution_input(quantized, 1) and convolution_input(zero_point, 3)):
            continue
        # ORT's quantizer keeps computing the scale and the zero point (its uint8 values go unread); the zero
        # point less 128, and the values quantized again with it as int8 (QuantizeLinear: the same rounding)
        node.output[0], node.output[2] = f"{quantized}.unsigned", f"{zero_point}.unsigned"
        nodes += [
            make("BitwiseXor", [node.output[2], _SIGN_BIT], [f"{zero_point}.flipped"], name=f"{zero_point}.flip"),
            make("Cast", [f"{zero_point}.flipped"], [zero_point], to=onnx.TensorProto.INT8, name=f"{zero_point}.int8"),
            make("QuantizeLinear", [node.input[0], scale, zero_point], [quantized], name=f"{quantized}.int8"),
        ]
        rewritten += 1
    if rewritten:
        graph.initializer.append(numpy_helper.from_array(np.array(0x80, np.uint8), _SIGN_BIT))  # BitwiseXor: opset 18+
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, str(path))
    return rewritten


def quantize_int8_static(src: Path, dst: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    """Static int8 (QDQ): weights int8 per channel, activation ranges fixed from `calibration` runs
    (MinMax; bench/precision.py calibrates on the gate's real text). Measured against dynamic by
    bench/precision.py; not written by `bigs export`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.pending = iter(calibration)

        def get_next(self):
            return next(self.pending, None)

    quantize_static(
        str(src),
        str(dst),
        Feeds(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=QUANTIZED_OP_TYPES,
        nodes_to_exclude=constant_left_matmuls(src),
        use_external_data_format=True,
        extra_options={"MatMulConstBOnly": True},
    )


def quantize_int8_blockwise(src: Path, dst: Path, block_size: int = 32) -> None:
    """Int8 weights in blocks of `block_size` along the input dimension, computed with int8 activations
    quantized per row and block (ORT MatMulNBits, 8 bits, accuracy_level 4). Measured against dynamic by
    bench/precision.py (as accurate as fp32 to the gate, slower than dynamic on ORT CPU); not written by
    `bigs export`."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=8,
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=4,
        nodes_to_exclude=constant_left_matmuls(src),
        op_types_to_quantize=("MatMul",),
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=True)


# --------------------------------------------------------------------------------------------
# One weights file for every graph
# --------------------------------------------------------------------------------------------


@dataclass
class WeightsFileWriter:
    """Initializers moved out of the graphs into one file, one copy per distinct content."""

    path: Path
    tensors: dict[str, dict] = field(default_factory=dict)  # name → {dtype, shape, offset, length}
    _by_content: dict[str, str] = field(default_factory=dict)  # content hash → name

    def __post_init__(self):
        self.path.write_bytes(b"")

    def add(self, name: str, array: np.ndarray) -> str:
        """Store `array` (once per content); returns its canonical name."""
        array = np.ascontiguousarray(array)
        digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()
        if digest in self._by_content:
            return self._by_content[digest]
        # Own namespace: a shared name never collides with a name the exporter gave something else.
        canonical = f"shared/{name}"
        if canonical in self.tensors:  # same name, other content (e.g. an SSM constant per bucket)
            canonical = f"{canonical}.{digest[:12]}"
        with self.path.open("ab") as f:
            align = PAGE if array.nbytes >= PAGE_ALIGN_BYTES else ALIGN
            offset = -(-f.tell() // align) * align
            f.write(b"\0" * (offset - f.tell()))
            f.write(array.tobytes())
        self.tensors[canonical] = {
            "dtype": array.dtype.name,
            "shape": list(array.shape),
            "offset": offset,
            "length": array.nbytes,
        }
        self._by_content[digest] = canonical
        return canonical

    def externalize(self, model: onnx.ModelProto) -> list[str]:
        """Move `model`'s large initializers into the file and point the graph at it; returns their names."""
        renames, shared, duplicates = {}, [], []
        for init in model.graph.initializer:
            array = numpy_helper.to_array(init)
            if array.nbytes < MIN_SHARED_BYTES:
                continue
            canonical = self.add(init.name, array)
            entry = self.tensors[canonical]
            renames[init.name] = canonical
            if canonical in shared:  # the same content twice in one graph: keep one initializer
                duplicates.append(init)
                continue
            init.name = canonical
            init.ClearField("raw_data")
            for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                init.ClearField(f)
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            for key, value in (("location", self.path.name), ("offset", entry["offset"]), ("length", entry["length"])):
                init.external_data.add(key=key, value=str(value))
            shared.append(canonical)
        for init in duplicates:
            model.graph.initializer.remove(init)
        _rename_inputs(model.graph, renames)
        return shared


def _rename_inputs(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for attr in node.attribute:  # subgraphs (none expected; kept correct anyway)
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(attr.g, renames)
    for value in graph.value_info:
        if value.name in renames:
            value.name = renames[value.name]


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def io_spec(model: onnx.ModelProto) -> dict:
    """Input/output names, dtypes and shapes (symbolic dims by name) of a graph."""

    def describe(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
            out.append(
                {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": shape}
            )
        return out

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


# FusedGemm(activation=A) → Gemm, A: ORT's offline optimisation fuses the pooler's dense + tanh into
# its contrib op FusedGemm, which OpenVINO's ONNX reader mistranslates (a classifier's logits came
# out wrong by 1.5 at fp32). Split back, the graph is standard ONNX there, at the cost of one
# elementwise op on (B, d).
SPLIT_ACTIVATIONS = ("Tanh", "Relu", "Sigmoid")


def split_fused_gemms(model: onnx.ModelProto) -> int:
    """Replace every FusedGemm whose activation is a plain ONNX op by Gemm + that op; the count."""
    nodes, split = [], 0
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        activation = attrs.get("activation", b"").decode() if node.op_type == "FusedGemm" else ""
        if node.domain != "com.microsoft" or activation not in SPLIT_ACTIVATIONS:
            nodes.append(node)
            continue
        gemm_attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
        linear = f"{node.output[0]}/linear"
        nodes.append(onnx.helper.make_node("Gemm", list(node.input), [linear], name=f"{node.name}/gemm", **gemm_attrs))
        nodes.append(onnx.helper.make_node(activation, [linear], list(node.output), name=f"{node.name}/{activation}"))
        split += 1
    if split:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return split


def finish_graph(src: Path, dst: Path, weights: WeightsFileWriter) -> dict:
    """Load an exported/optimised graph, move its weights to the shared file, check and save it."""
    model = onnx.load(str(src), load_external_data=True)
    split_fused_gemms(model)
    shared = weights.externalize(model)
    onnx.save(model, str(dst))
    onnx.checker.check_model(str(dst))  # by path: resolves the external data
    ops = Counter(n.op_type for n in model.graph.node)
    return {"shared_initializers": shared, "op_types": dict(sorted(ops.items())), **io_spec(model)}


# Writes one bucket's int8 graph: (length, its finished fp32 graph, where to write the int8 one)
WriteInt8 = Callable[[int, Path, Path], None]
# What decides the int8 graphs: called once, with the finished fp32 graphs of the buckets it searches at
# ({bucket: graph}: export/int8_search.py `search_buckets`); answers how every bucket's graph is written
# (export/int8_search.py `Int8Plan.write`)
PlanInt8 = Callable[[dict[int, Path]], WriteInt8]


def default_int8(length: int, fp32_graph: Path, dst: Path) -> None:
    """Every weight product int8 by the default recipe, at every bucket: where no search runs (no tokenizer)."""
    write_int8_graph(fp32_graph, dst, Int8Recipe())


def export_onnx(
    model: torch.nn.Module,
    buckets: list[int],
    onnx_dir: Path,
    quantize: str | None = None,
    embedding: SentenceEmbedding | None = None,
    done: Callable[[int], object] | None = None,
    plan_int8: PlanInt8 | None = None,
) -> OnnxSection:
    """Export every bucket into `onnx_dir`; returns the manifest's onnx section (files relative to
    the export dir; hashes and parity are added by the caller). `embedding`: as for `torch_to_onnx`.
    `done(bucket)` is called as each bucket's graphs are written (the export's progress lines).
    With `quantize="int8"`, each bucket's int8 twin is quantized from its finished fp32 graph by the
    recipe `plan_int8` returns once the graphs of the buckets it searches at are written (the default
    recipe without it); the buckets before that are quantized then."""
    from .int8_search import search_buckets
    from .tracing import traced_ahead

    onnx_dir.mkdir(parents=True, exist_ok=True)
    weights = WeightsFileWriter(onnx_dir / WEIGHTS_FILE)
    section = {
        "exporter": f"torch.onnx.export(dynamo=True, opset_version={opset_for(model)})",
        "offline_optimization": OFFLINE_OPTIMIZATION_LEVEL,
        "session_options": SESSION_OPTIONS,
        "weights_file": f"onnx/{WEIGHTS_FILE}",
        "buckets": {},
    }
    write_int8: WriteInt8 | None = None
    searched_at = search_buckets(buckets)
    pending: list[int] = []  # buckets whose fp32 graph is written, waiting for the int8 recipe
    longer = [b for b in sorted(buckets) if b > max(searched_at)]  # traced in a child meanwhile (export/tracing.py)
    with (
        tempfile.TemporaryDirectory(prefix="bigs-onnx-") as tmp,
        tempfile.TemporaryDirectory(prefix="bigs-onnx-ahead-") as ahead_dir,
        traced_ahead(model, embedding, longer, Path(ahead_dir)) as ahead,
    ):
        tmp = Path(tmp)

        def quantize_bucket(length: int) -> None:
            q_opt = tmp / f"{length}.int8.opt.onnx"
            # from the finished graph: its weights carry their names in weights.bin, which the recipe uses
            write_int8(length, onnx_dir / f"{length}.onnx", q_opt)
            q_entry = {"file": f"onnx/{length}.int8.onnx", **formulation_for(length, model.config.routing).as_dict()}
            q_entry.update(finish_graph(q_opt, onnx_dir / f"{length}.int8.onnx", weights))
            section["buckets"][str(length)]["int8"] = q_entry
            for f in tmp.iterdir():  # keep the temp dir small for big models
                os.remove(f)
            if done is not None:
                done(length)

        for length in sorted(buckets):
            formulation = formulation_for(length, model.config.routing)
            raw, optimized = tmp / f"{length}.raw.onnx", tmp / f"{length}.opt.onnx"
            if ahead is not None and length in ahead:
                raw = ahead.raw_graph(length)
            else:
                torch_to_onnx(model, length, formulation, raw, embedding)
            ort_optimize(raw, optimized)
            for f in raw.parent.glob(f"{raw.name}*"):  # the raw graph and its weights: optimised, not needed
                os.remove(f)
            entry = {"file": f"onnx/{length}.onnx", **formulation.as_dict()}
            entry.update(finish_graph(optimized, onnx_dir / f"{length}.onnx", weights))
            section["buckets"][str(length)] = entry
            for f in tmp.iterdir():
                os.remove(f)
            if quantize != "int8":
                if done is not None:
                    done(length)
                continue
            pending.append(length)
            if write_int8 is None and set(searched_at) <= set(pending):
                graphs = {b: onnx_dir / f"{b}.onnx" for b in searched_at}
                write_int8 = plan_int8(graphs) if plan_int8 else default_int8
            if write_int8 is not None:
                for waiting in pending:
                    quantize_bucket(waiting)
                pending.clear()
    section["weights"] = weights.tensors
    return OnnxSection.model_validate(section)
