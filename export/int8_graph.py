"""Fewer fp32 passes in an int8 graph: two exact rewrites of what the int8 recipe writes (export/int8_recipe.py).

At 4,096 tokens an int8 graph's integer products take under half of its time; most of the rest is passes
over (L, d) and (L, I) fp32 tensors that ONNX Runtime's CPU provider runs one op at a time: the GELUs, the
gates' products, and the Mul by 1/s before each smoothed product (docs/BENCHMARKS.md, the profile). Both
rewrites compute the same function with fewer such passes; neither changes an integer product.

1. `biases_into_products`: a GELU after an int8 product (`DynamicQuantizeMatMul`, `MatMulIntegerToFloat`)
   adds that product's bias itself (ORT's `BiasGelu`, or `FastGelu` with a bias), a read of the product's
   output before the GELU proper. The int8 products take a bias of their own, added as their integer sums
   are scaled to float, in the same pass: so the bias goes there, and the GELU reads the biased output,
   as ONNX's `Gelu` (erf, exact: 4e-7 of the erf formula; opset 20) or `FastGelu` without a bias (where
   the tanh form was asked). The fp32 graphs keep `BiasGelu`: an fp32 MatMul takes no bias.
2. `fold_smoothing` (on the smoothed fp32 graph, before quantizing): a smoothed product reads x / s
   (export/int8_recipe.py `smooth_products`). Where x is linear in something the graph already scales, 1/s goes
   there instead of into a Mul of its own:
   - a block's LayerNorm read by smoothed products alone: LN(x)·γ + β divided by the first product's s
     is LN with γ / s and β / s, so that product reads the LayerNorm itself and the others multiply by
     their ratio to it (one Mul of three gone);
   - a gate's product U = a ⊙ b where b = y W + c is a weight product's output: U / s = a ⊙ (y (W / s)
     + c / s), W's columns and c divided by s (quantized per output channel, W / s gives the same
     integer weights at the scales divided by s).

Measured on the defaults' 4,096-token int8 graphs (2-core AMD EPYC with AVX512-VNNI, docs/BENCHMARKS.md): the
GELUs and a smoothed graph's Muls take a few ms less under ORT's profiler, the products around them about as much
more, and end to end the graphs are within the host's spread of the graphs before. What they do buy is the exact
GELU at the tanh form's cost (export/int8_search.py `LEVER_TRIES`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

# The int8 products that take a bias, and the input it goes in (com.microsoft contrib ops)
BIAS_INPUT = {"DynamicQuantizeMatMul": 4, "MatMulIntegerToFloat": 6}
# ORT's GELUs that add a bias themselves (their second input)
BIASED_GELUS = ("BiasGelu", "FastGelu")
ONNX_GELU_OPSET = 20  # ONNX's own Gelu op


def _uses(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    uses: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            uses[name].append(node)
    return uses


def _onnx_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def biases_into_products(path: Path) -> int:
    """Rewrite 1 of the module docstring on the optimised int8 graph at `path` (its weights stay where they are):
    each GELU that adds the bias of the int8 product before it, with that bias moved into the product. Returns
    how many GELUs were rewritten."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    uses = _uses(graph)
    outputs = {o.name for o in graph.output}
    exact_gelu = _onnx_opset(model) >= ONNX_GELU_OPSET
    nodes, moved = [], 0
    for node in graph.node:
        product = producer.get(node.input[0]) if node.input else None
        slot = BIAS_INPUT.get(product.op_type) if product is not None else None
        if (
            node.domain == "com.microsoft"
            and node.op_type in BIASED_GELUS
            and len(node.input) > 1
            and node.input[1]
            and slot is not None
            and (len(product.input) <= slot or not product.input[slot])
            and len(uses[node.input[0]]) == 1  # the product's output is read by this GELU alone
            and node.input[0] not in outputs
            and (node.op_type == "FastGelu" or exact_gelu)
        ):
            product.input.extend([""] * (slot + 1 - len(product.input)))
            product.input[slot] = node.input[1]
            if node.op_type == "BiasGelu":  # erf: ONNX's own Gelu, default approximate="none"
                node = onnx.helper.make_node("Gelu", [node.input[0]], list(node.output), name=node.name)
            else:  # the tanh form asked for: the same op, without the bias
                del node.input[1:]
            moved += 1
        nodes.append(node)
    if moved:
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, str(path))
    return moved


def fold_smoothing(
    model: onnx.ModelProto,
    initializers: dict[str, onnx.TensorProto],
    is_smoothing: Callable[[onnx.NodeProto], bool],
    fp32_weights: frozenset[str],
) -> int:
    """Rewrite 2 of the module docstring, in place, on a graph whose smoothed products read `is_smoothing(node)`
    Muls by 1/s (their second input a constant; export/int8_recipe.py `smooth_products`). `initializers` (name →
    tensor, with the weights loaded) gains the rescaled constants under names of their own: every original
    tensor is left as it is (the fp32 graphs share them). A product whose weight is in `fp32_weights` keeps its
    weight's name (the quantizer finds it by it), so nothing is folded into it. Returns the Muls removed."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    uses = _uses(graph)
    outputs = {o.name for o in graph.output}
    removed: list[onnx.NodeProto] = []
    replaced: set[str] = set()  # constants the graph may no longer read

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(initializers[name]).astype(np.float64)

    def add(name: str, values: np.ndarray) -> str:
        initializers[name] = numpy_helper.from_array(values.astype(np.float32), name)
        graph.initializer.append(initializers[name])
        return name

    def bypass(mul: onnx.NodeProto) -> None:
        """Drop `mul` (x · 1/s): its readers read x, which now carries the 1/s."""
        for reader in uses[mul.output[0]]:
            for i, name in enumerate(reader.input):
                if name == mul.output[0]:
                    reader.input[i] = mul.input[0]
        removed.append(mul)
        replaced.add(mul.input[1])

    # A LayerNorm read only by smoothing Muls: the first one's 1/s goes into γ and β, the others take the ratio
    for norm in graph.node:
        readers = uses[norm.output[0]] if norm.op_type == "LayerNormalization" else []
        if (
            not readers
            or norm.output[0] in outputs
            or not all(is_smoothing(r) and r.input[0] == norm.output[0] for r in readers)
            or not all(name in initializers for name in norm.input[1:3] if name)
        ):
            continue
        first, *others = readers
        inverse = array(first.input[1])
        for i in (1, 2):  # γ, and β where the LayerNorm has one
            if len(norm.input) > i and norm.input[i]:
                replaced.add(norm.input[i])
                norm.input[i] = add(f"{norm.input[i]}.smoothed", array(norm.input[i]) * inverse)
        for other in others:
            replaced.add(other.input[1])
            other.input[1] = add(f"{other.input[1]}.relative", array(other.input[1]) / inverse)
        bypass(first)

    # A gate's product a ⊙ b read only by a smoothing Mul, b = y W + c a weight product's output: 1/s into W and c
    for mul in [n for n in graph.node if is_smoothing(n) and n not in removed]:
        gate = producer.get(mul.input[0])
        if gate is None or gate.op_type != "Mul" or len(uses[gate.output[0]]) != 1 or gate.output[0] in outputs:
            continue
        for operand in reversed(gate.input):
            linear = _biased_weight_product(operand, producer, uses, initializers, fp32_weights)
            if linear is None:
                continue
            matmul, bias_add, bias_at = linear
            inverse = array(mul.input[1])
            bias = bias_add.input[bias_at]
            replaced.update((matmul.input[1], bias))
            matmul.input[1] = add(f"{matmul.input[1]}.gated", array(matmul.input[1]) * inverse[None, :])
            bias_add.input[bias_at] = add(f"{bias}.gated", array(bias) * inverse)
            bypass(mul)
            break

    for node in removed:
        graph.node.remove(node)
    # the constants the rewrite stopped reading (a removed Mul's 1/s, the γ, β, W and c replaced): gone from this
    # graph, so that no optimiser has to drop them later
    read = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name in replaced and i.name not in read]:
        graph.initializer.remove(init)
        del initializers[init.name]
    return len(removed)


def _biased_weight_product(name, producer, uses, initializers, fp32_weights):
    """(MatMul, Add, the Add's bias input) where `name` is Add(MatMul(y, W), c), both read once, W and c
    constants of the right shapes and W not left in fp32; else None."""
    bias_add = producer.get(name)
    if bias_add is None or bias_add.op_type != "Add" or len(uses[name]) != 1:
        return None
    for at in (0, 1):
        matmul, bias = producer.get(bias_add.input[1 - at]), bias_add.input[at]
        if (
            matmul is not None
            and matmul.op_type == "MatMul"
            and len(uses[matmul.output[0]]) == 1
            and matmul.input[1] in initializers
            and matmul.input[1] not in fp32_weights
            and bias in initializers
            and len(initializers[matmul.input[1]].dims) == 2
            and list(initializers[bias].dims) == [initializers[matmul.input[1]].dims[1]]
        ):
            return matmul, bias_add, at
    return None
