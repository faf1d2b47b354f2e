"""Int8 recipes: how one bucket's fp32 graph becomes its int8 graph (ORT dynamic quantization).

`Int8Recipe` says which weight products stay fp32, how the rest are smoothed, and which levers on the fp32
remainder are taken (the int8 search decides it, export/int8_search.py); `write_int8_graph` is the one
function that turns a finished fp32 graph into the int8 graph the export writes, the search gates and
`bigs bench precision` times: `quantize_dynamic` (MatMul/Gemm weights int8 per output channel, the SSM
convolutions kept fp32 by name unless the recipe takes them too), then optimised offline like every graph
(export/ort_optimization.py), then the exact rewrites of export/int8_graph.py. (bf16 needs no graph of its
own: OpenVINO runs the fp32 graphs at bf16, export/openvino_runtime.py.) The static and blockwise quantizers
below are measured by bench/precision.py and never written by `bigs export`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from .int8_graph import biases_into_products, fold_smoothing
from .ort_optimization import ort_optimize


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
