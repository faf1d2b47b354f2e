"""The int8 graph's exact rewrites (export/int8_graph.py), on small graphs of a BiGS block's shapes.

- A GELU after an int8 product reads the product with its bias added: no GELU adds a bias any more, the
  product carries it, and the answers are the graph's before the rewrite (erf: ONNX's Gelu; tanh: FastGelu)
  to float rounding; a GELU whose input is not an int8 product, or is read twice, keeps its bias.
- Smoothing folded: a LayerNorm read by smoothed products alone takes the first one's 1/s (one Mul of three
  gone), a gate's linear takes the 1/s of the product after the gate (its Mul gone), the same function in
  fp32; a product left in fp32 is never folded into (the quantizer finds it by its weight's name); and the
  int8 graph of the folded form answers as the unfolded one's does, within rounding.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from export.int8_graph import biases_into_products
from export.int8_recipe import Int8Recipe, smooth_products, weight_products, write_int8_graph
from export.ort_optimization import ort_optimize

D, I, L = 16, 48, 32  # hidden, intermediate, tokens
RNG = np.random.default_rng(0)


def _tensor(name, *shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def block_graph(path, gelu="Gelu"):
    """x → LayerNorm → (H Wv + bv, H Wf + bf, H Wb + bb), GELU on the first two, U = (F Wuf + cf) ⊙ (B Wub + cb),
    y = (GELU(U Wdol + bdol) ⊙ V) Wdo + bdo: a BiGS block's products (the SSMs left out), opset 20, optimised
    offline as export optimises its graphs (each bias and GELU one BiasGelu); its weights by name."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", L, D])  # batch dynamic, as exported
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    weights = [
        _tensor("gamma", D, scale=1.0), _tensor("beta", D),
        _tensor("Wv", D, I), _tensor("bv", I), _tensor("Wf", D, D), _tensor("bf", D), _tensor("Wb", D, D),
        _tensor("bb", D), _tensor("Wuf", D, D), _tensor("cf", D), _tensor("Wub", D, D), _tensor("cb", D),
        _tensor("Wdol", D, I), _tensor("bdol", I), _tensor("Wdo", I, D), _tensor("bdo", D),
    ]  # fmt: skip
    node = helper.make_node
    nodes = [
        node("LayerNormalization", ["x", "gamma", "beta"], ["H"], axis=-1, name="norm"),
        node("MatMul", ["H", "Wv"], ["hv"], name="mm_v"), node("Add", ["hv", "bv"], ["av"], name="add_v"),
        node(gelu, ["av"], ["V"], name="gelu_v"),
        node("MatMul", ["H", "Wf"], ["hf"], name="mm_f"), node("Add", ["hf", "bf"], ["af"], name="add_f"),
        node(gelu, ["af"], ["F"], name="gelu_f"),
        node("MatMul", ["H", "Wb"], ["hb"], name="mm_b"), node("Add", ["hb", "bb"], ["B"], name="add_b"),
        node("MatMul", ["F", "Wuf"], ["uf"], name="mm_uf"), node("Add", ["uf", "cf"], ["a"], name="add_uf"),
        node("MatMul", ["B", "Wub"], ["ub"], name="mm_ub"), node("Add", ["ub", "cb"], ["b"], name="add_ub"),
        node("Mul", ["a", "b"], ["U"], name="gate"),
        node("MatMul", ["U", "Wdol"], ["hd"], name="mm_dol"), node("Add", ["hd", "bdol"], ["ad"], name="add_dol"),
        node(gelu, ["ad"], ["G"], name="gelu_dol"),
        node("Mul", ["G", "V"], ["O"], name="out_gate"),
        node("MatMul", ["O", "Wdo"], ["ho"], name="mm_do"), node("Add", ["ho", "bdo"], ["y"], name="add_do"),
    ]  # fmt: skip
    model = helper.make_model(
        helper.make_graph(nodes, "block", [x], [y], weights), opset_imports=[helper.make_opsetid("", 20)]
    )
    raw = path.with_suffix(".raw.onnx")
    onnx.save(onnx.shape_inference.infer_shapes(model), str(raw))  # every tensor typed, as the exporter writes them
    ort_optimize(raw, path)  # as export optimises every fp32 graph before quantizing it: MatMul, BiasGelu
    return {w.name: numpy_helper.to_array(w) for w in weights}


def run(path, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def op_types(path):
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def test_each_gelu_after_an_int8_product_reads_it_with_its_bias_and_answers_as_before(tmp_path):
    block_graph(tmp_path / "block.onnx")
    x = RNG.standard_normal((2, L, D)).astype(np.float32)
    for tanh in (False, True):
        before, after = tmp_path / f"before.{tanh}.onnx", tmp_path / f"after.{tanh}.onnx"
        write_int8_graph(tmp_path / "block.onnx", before, Int8Recipe(gelu_approximation=tanh, biases_in_products=False))
        write_int8_graph(tmp_path / "block.onnx", after, Int8Recipe(gelu_approximation=tanh))
        gelu = "FastGelu" if tanh else "BiasGelu"
        assert op_types(before)[gelu] == 3, op_types(before)
        graph = onnx.load(str(after), load_external_data=False).graph
        producer = {out: n for n in graph.node for out in n.output}
        gelus = [n for n in graph.node if n.op_type in ("Gelu", "FastGelu", "BiasGelu")]
        assert [n.op_type for n in gelus] == ["FastGelu" if tanh else "Gelu"] * 3
        for n in gelus:
            assert len(n.input) == 1, n  # no bias of its own
            product = producer[n.input[0]]
            bias = product.input[4 if product.op_type == "DynamicQuantizeMatMul" else 6]
            assert product.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat") and bias, product
        np.testing.assert_allclose(run(after, x), run(before, x), rtol=1e-5, atol=1e-5)


def test_a_gelu_whose_input_is_no_int8_product_or_is_read_twice_keeps_its_bias(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, L, D])
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("g", "h", "k")]
    nodes = [
        helper.make_node("DynamicQuantizeMatMul", ["x", "Wq", "ws", "wz"], ["p"], domain="com.microsoft"),
        helper.make_node("BiasGelu", ["p", "bias"], ["g"], domain="com.microsoft"),
        helper.make_node("Relu", ["p"], ["h"]),  # the product's output read twice
        helper.make_node("BiasGelu", ["x", "bias"], ["k"], domain="com.microsoft"),  # no product before it
    ]
    weights = [
        numpy_helper.from_array(RNG.integers(-63, 63, (D, D)).astype(np.int8), "Wq"),
        numpy_helper.from_array(np.full(D, 0.01, np.float32), "ws"),
        numpy_helper.from_array(np.zeros(D, np.int8), "wz"),
        _tensor("bias", D),
    ]
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, weights), opset_imports=opsets)
    onnx.save(model, str(tmp_path / "g.onnx"))
    assert biases_into_products(tmp_path / "g.onnx") == 0
    assert op_types(tmp_path / "g.onnx")["BiasGelu"] == 2


def test_smoothing_folds_into_the_layernorm_and_the_gates_linear_and_computes_what_the_graph_computes(tmp_path):
    weights = block_graph(tmp_path / "block.onnx")
    products = {n.input[1] for n in weight_products(onnx.load(str(tmp_path / "block.onnx")))}
    factors = {w: np.exp(RNG.standard_normal(weights[w].shape[0])) for w in products}
    x = RNG.standard_normal((2, L, D)).astype(np.float32)
    want = run(tmp_path / "block.onnx", x)
    for fold, muls in ((False, 2 + 7), (True, 2 + 7 - 2)):  # the gates' two, one per smoothed product, less two
        dst = tmp_path / f"smoothed.{fold}.onnx"
        assert smooth_products(tmp_path / "block.onnx", dst, factors, frozenset(), fold) == 7
        assert op_types(dst)["Mul"] == muls, (fold, op_types(dst))
        np.testing.assert_allclose(run(dst, x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    graph = onnx.load(str(tmp_path / "smoothed.True.onnx"), load_external_data=False).graph
    readers = [n for n in graph.node if "H" in n.input]
    assert sorted(n.op_type for n in readers) == ["MatMul", "Mul", "Mul"]  # the first reads the LayerNorm itself
    assert {i.name for i in graph.initializer} >= {"gamma.smoothed", "beta.smoothed", "cb.gated"}
    # the int8 graphs of both forms: the same integer products, the same answers within rounding
    ints = {}
    for fold in (False, True):
        recipe = Int8Recipe(smoothing=factors, smoothing_folded=fold)
        write_int8_graph(tmp_path / "block.onnx", tmp_path / f"int8.{fold}.onnx", recipe)
        ints[fold] = run(tmp_path / f"int8.{fold}.onnx", x)
    np.testing.assert_allclose(ints[True], ints[False], rtol=1e-3, atol=2e-3 * np.abs(ints[False]).max())


def test_a_product_left_in_fp32_is_not_folded_into_and_keeps_its_weights_name(tmp_path):
    """The gate's 1/s goes into the other linear where one is left fp32, and stays a Mul where both are."""
    weights = block_graph(tmp_path / "block.onnx")
    products = {n.input[1] for n in weight_products(onnx.load(str(tmp_path / "block.onnx")))}
    factors = {w: np.exp(RNG.standard_normal(weights[w].shape[0])) for w in products}
    x = RNG.standard_normal((2, L, D)).astype(np.float32)
    want = run(tmp_path / "block.onnx", x)
    for kept, smoothed in ((frozenset({"Wub"}), 6), (frozenset({"Wub", "Wuf"}), 5)):
        dst = tmp_path / f"smoothed.{len(kept)}.onnx"
        assert smooth_products(tmp_path / "block.onnx", dst, factors, kept) == smoothed
        graph = onnx.load(str(dst), load_external_data=False).graph
        weight_of = {n.name: n.input[1] for n in graph.node if n.op_type == "MatMul"}
        assert all(weight_of[f"mm_{w[1:]}"] == w for w in kept)  # found by name, as the quantizer looks
        left = "mm_dol.smoothed" in {n.name for n in graph.node}
        assert left == (len(kept) == 2), kept
        assert weight_of["mm_uf"].endswith(".gated") == (len(kept) == 1)
        np.testing.assert_allclose(run(dst, x), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
