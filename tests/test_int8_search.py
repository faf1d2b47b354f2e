"""The int8 search (export/int8_search.py): which products stay fp32, and the levers it tries and keeps.

Every weight product left in fp32 is named in the manifest; the search leaves the products of largest int8
error in fp32 until the gate passes, tries the levers (SmoothQuant smoothing, int8 SSM convolutions, ORT's
tanh GELU, signed convolution inputs) on the chosen recipe last and per longer bucket, and says so when no
try passes (auto then never serves the variant); the recipe rebuilt from the manifest makes the served graph
again; int8 with 8-bit weights is served only where int8 sums are exact (VNNI or AMX-INT8) or its gate ran
on that CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from precision_fixtures import SAPPHIRE_RAPIDS, SKYLAKE, ZEN4, _tampered_copy, int8_openvino_runs_here

from service.precision_policy import PrecisionUnavailable, choose_precision, cpu_description, variant_statuses


def fp32_weight_products(graph: Path) -> set[str]:
    """The weights that a plain (fp32) MatMul of `graph` multiplies: the products int8 left in fp32."""
    import onnx

    from export.int8_recipe import weight_products

    return {node.input[1] for node in weight_products(onnx.load(str(graph), load_external_data=False))}


@pytest.mark.slow
def test_every_weight_product_an_export_leaves_in_fp32_is_named_in_its_manifest(variant_exports):
    from export.int8_search import search_buckets
    from export.manifest import read_manifest

    for name, export_dir in variant_exports.items():
        manifest = read_manifest(export_dir)
        search = manifest.precisions["int8"].search
        assert search.bucket == min(manifest.buckets) and search.weight_bits == 7 and search.tries, name
        assert search.gated_at == search_buckets(manifest.buckets) == [128, 512]  # the shortest, and 512
        assert search.chosen.passed == search.passed
        named = {product.weight for product in search.fp32}
        for bucket in manifest.buckets:
            assert fp32_weight_products(export_dir / manifest.onnx.graph(bucket, "int8").file) == named, (name, bucket)


@pytest.mark.slow
def test_the_search_tries_the_levers_on_the_chosen_recipe_last_and_the_graphs_carry_the_ones_it_kept(variant_exports):
    """Step 4 of the int8 search: with the weight products settled, the SSM convolutions in int8 (`LEVER_TRIES`),
    gated like any try; where it passes the graphs are made with it, and the manifest says so. Every graph is
    written with the exact rewrites, and the manifest says that too."""
    import onnx

    from export.cpu import has_exact_int8_products
    from export.int8_recipe import constant_left_matmuls
    from export.int8_search import LEVER_TRIES
    from export.manifest import read_manifest

    for name, export_dir in variant_exports.items():
        manifest = read_manifest(export_dir)
        search = manifest.precisions["int8"].search
        assert search.passed, name
        levered = [t for t in search.tries if t.ssm_convolutions or t.gelu_approximation]
        assert levered and levered == search.tries[-len(levered) :], name  # after every weight-product try
        tried = [{k for k in ("ssm_convolutions", "gelu_approximation") if getattr(t, k)} for t in levered]
        assert tried == [set(lever) for lever in LEVER_TRIES][: len(levered)], name  # in order, until one passed
        assert all(t.fp32_products == len(search.fp32) and t.calibrated_at == search.calibrated_at for t in levered)
        assert all(not t.passed for t in levered[:-1])
        kept = levered[-1] if levered[-1].passed else None
        assert search.chosen is (kept or search.chosen) and (search.ssm_convolutions, search.gelu_approximation) == (
            (kept.ssm_convolutions, kept.gelu_approximation) if kept else (False, False)
        ), name
        for bucket in manifest.buckets:
            graph = export_dir / manifest.onnx.graph(bucket, "int8").file
            ops = [n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node]
            ssm, gelu = search.levers_at(bucket)  # the search's at the buckets it gated, step 5's past them
            assert ("FastGelu" in ops) == gelu, (name, bucket)
            assert (len(constant_left_matmuls(graph)) == 0) == ssm, (name, bucket)
            if ssm:  # the inputs signed (u8·s8) only where this CPU sums int8 products in int32
                quantized_by = set(_convolution_inputs(graph).values())
                assert quantized_by == {"QuantizeLinear" if search.ssm_inputs_signed else "DynamicQuantizeLinear"}
        levered = [b for b in manifest.buckets if search.levers_at(b)[0]]
        assert search.ssm_inputs_signed == (bool(levered) and has_exact_int8_products()), name
        assert search.biases_in_products and search.smoothing_folded == (search.smoothing is not None), name
        # step 5: each longer bucket gated with the SSM lever, whatever the search's buckets decided
        longer = [b for b in manifest.buckets if b > max(search.gated_at)]
        assert sorted(search.long_buckets) == longer, name
        for bucket, tried in search.long_buckets.items():
            assert (tried.ssm_convolutions, tried.gelu_approximation) == (True, False)
            assert tried.gate.sequences == manifest.precisions["int8"].gate[bucket].sequences, (name, bucket)


@pytest.mark.slow
def test_the_search_leaves_the_products_of_largest_int8_error_in_fp32_until_the_gate_passes_and_names_each(
    variant_exports, tmp_path, tokenizer
):
    """Thresholds no all-int8 graph of the tiny model meets, so the search has to leave products in fp32."""
    from export.heads import primary_head
    from export.int8_recipe import quantize_int8
    from export.int8_search import search_buckets, search_int8
    from export.manifest import GateThresholds, read_manifest

    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    graphs = {b: export_dir / manifest.onnx.graph(b).file for b in search_buckets(manifest.buckets)}
    graph, head = graphs[128], primary_head(manifest.model.architecture)

    def halfway_to_1(cosine: float, at_least: float = 0.0) -> GateThresholds:
        return GateThresholds(embedding_cosine_min=max(at_least, cosine + (1 - cosine) / 2))

    recorded = manifest.precisions["int8"].search.tries[0].gate  # everything int8, default thresholds
    strict = halfway_to_1(recorded.embedding_cosine_min)
    search = search_int8(graphs, tokenizer, head, strict).record
    # everything int8 unsmoothed first, then everything int8 smoothed with the first bucket's factors
    assert [(t.calibrated_at, t.fp32_products) for t in search.tries[:2]] == [([], 0), ([128], 0)]
    assert not search.tries[0].passed and not search.tries[0].smoothed and search.tries[1].smoothed
    # bars no all-int8 graph meets, either calibration: products must be left in fp32, by the smoothed ranking
    bar = strict
    for _ in range(3):
        all_int8 = [t.gate.embedding_cosine_min for t in search.tries if t.smoothed and t.fp32_products == 0]
        bar = halfway_to_1(max(all_int8), at_least=bar.embedding_cosine_min)
        found = search_int8(graphs, tokenizer, head, bar)
        recipe, search = found.recipe, found.record
        if search.fp32:
            break

    assert not search.tries[0].passed and search.tries[0].fp32_products == 0
    # both calibrations tried with every product int8, then the products left fp32 with every bucket's
    assert [(t.calibrated_at, t.fp32_products) for t in search.tries[1:3]] == [([128], 0), ([128, 512], 0)]
    assert all(t.smoothed and t.calibrated_at == [128, 512] for t in search.tries[3:])
    assert search.calibrated_at == [128, 512] and search.smoothing and recipe.smoothing
    assert search.passed and search.chosen.passed and search.chosen.smoothed
    assert sorted(search.chosen.gates_elsewhere) == [512]  # gated at 512 too, where it passed at 128
    chosen = len(search.fp32)
    assert chosen > 0 and recipe.fp32_weights == {product.weight for product in search.fp32}
    # the fewest tried that pass: every smoothed try with fewer products in fp32 failed
    assert all(not t.passed for t in search.tries if t.fp32_products < chosen)
    assert [product.rank for product in search.fp32] == list(range(1, chosen + 1))
    errors = [product.error for product in search.fp32]
    assert errors == sorted(errors, reverse=True) and all(
        p.why and p.where and 0 < p.macs_share < 1 for p in search.fp32
    )
    quantize_int8(graph, tmp_path / "searched.onnx", recipe)
    assert fp32_weight_products(tmp_path / "searched.onnx") == recipe.fp32_weights
    # its smoothing is calibrated at both buckets searched, not at the ranking's alone
    from export.gate import gate_batches
    from export.int8_search import RANKING_BATCHES, _feeds, activation_maxima, rank_products

    calibration = {b: [_feeds(x) for x in gate_batches(tokenizer, b, False)[:RANKING_BATCHES]] for b in graphs}
    both = rank_products(graph, calibration[128], 7, [activation_maxima(graphs[512], calibration[512])]).smoothing
    assert recipe.smoothing.keys() == both.keys()
    for weight, factors in both.items():
        np.testing.assert_array_equal(recipe.smoothing[weight], factors)


def test_smoothing_factors_are_smoothquants_and_shrink_the_int8_error_of_an_outlier_channel():
    from export.int8_search import quantized, quantized_weight, smoothing_factors

    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(64, 32)), rng.normal(size=(32, 16))
    x[:, 5] *= 80.0  # one outlier channel sets the activation's one range
    s = smoothing_factors(np.abs(x).max(axis=0), w, alpha=0.5)
    np.testing.assert_allclose(s, np.sqrt(np.abs(x).max(axis=0)) / np.sqrt(np.abs(w).max(axis=1)))
    np.testing.assert_allclose((x / s) @ (w * s[:, None]), x @ w, rtol=1e-12)  # exact before quantizing

    def error(factors):
        exact = x @ w
        return np.linalg.norm(
            quantized(x / factors) @ quantized_weight(w * factors[:, None], 7) - exact
        ) / np.linalg.norm(exact)

    assert error(s) < error(np.ones(32)) / 2
    # a channel that is zero on either side keeps factor 1
    x[:, 3], w[7] = 0.0, 0.0
    s = smoothing_factors(np.abs(x).max(axis=0), w)
    assert s[3] == 1.0 and s[7] == 1.0


@pytest.mark.slow
def test_smoothing_factors_take_each_channels_largest_activation_over_every_bucket_given(variant_exports, tokenizer):
    import onnx
    from onnx import numpy_helper

    from export.gate import gate_batches
    from export.int8_recipe import weight_products
    from export.int8_search import _feeds, activation_maxima, rank_products, smoothing_factors
    from export.manifest import read_manifest

    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    graphs = {b: export_dir / manifest.onnx.graph(b).file for b in (128, 512)}
    batches = {b: [_feeds(x) for x in gate_batches(tokenizer, b, False)[:2]] for b in graphs}
    short, long = (activation_maxima(graphs[b], batches[b]) for b in graphs)
    assert any((long[w] > short[w]).any() for w in short)  # some channel's outliers grow with length
    alone = rank_products(graphs[128], batches[128], 7)
    both = rank_products(graphs[128], batches[128], 7, [long])
    assert alone.smoothing.keys() == alone.smoothing_here.keys() == both.smoothing_here.keys()
    model = onnx.load(str(graphs[128]))
    weights = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    for weight in {n.input[1] for n in weight_products(model)}:
        here = smoothing_factors(short[weight], weights[weight])
        for factors in (alone.smoothing[weight], alone.smoothing_here[weight], both.smoothing_here[weight]):
            np.testing.assert_allclose(factors, here, rtol=1e-12)
        everywhere = smoothing_factors(np.maximum(short[weight], long[weight]), weights[weight])
        np.testing.assert_allclose(both.smoothing[weight], everywhere, rtol=1e-12)


@pytest.mark.slow
def test_a_smoothed_graph_computes_in_fp32_what_the_graph_computes(variant_exports, tmp_path, tokenizer):
    import onnx
    import onnxruntime as ort

    from export.gate import gate_batches
    from export.int8_recipe import smooth_products, weight_products
    from export.int8_search import _feeds, rank_products
    from export.manifest import read_manifest

    export_dir = variant_exports["cls"]
    graph = export_dir / read_manifest(export_dir).onnx.graph(128).file
    batches = [_feeds(b) for b in gate_batches(tokenizer, 128, False)[:2]]
    factors = rank_products(graph, batches, 7).smoothing
    products = weight_products(onnx.load(str(graph), load_external_data=False))
    assert smooth_products(graph, tmp_path / "smoothed.onnx", factors, frozenset()) == len(products) > 0
    kept = products[0].input[1]
    assert smooth_products(graph, tmp_path / "partly.onnx", factors, frozenset({kept})) == len(products) - 1
    sessions = [ort.InferenceSession(str(g), providers=["CPUExecutionProvider"])
                for g in (graph, tmp_path / "smoothed.onnx", tmp_path / "partly.onnx")]  # fmt: skip
    names = {i.name for i in sessions[0].get_inputs()}
    for feeds in batches:
        want, *gots = (s.run(None, {k: v for k, v in feeds.items() if k in names}) for s in sessions)
        for got in gots:
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.slow
def test_when_no_try_passes_the_search_says_so_and_auto_never_serves_the_variant(variant_exports, tmp_path, tokenizer):
    from export.heads import primary_head
    from export.int8_search import MAX_TRIES, search_int8
    from export.manifest import GateThresholds, read_manifest

    export_dir = variant_exports["mlm"]
    manifest = read_manifest(export_dir)
    impossible = GateThresholds(embedding_cosine_min=1.5)  # no graph but fp32 itself reaches it
    search = search_int8({128: export_dir / manifest.onnx.graph(128).file}, tokenizer,
                         primary_head(manifest.model.architecture), impossible).record  # fmt: skip
    assert not search.passed and not any(t.passed for t in search.tries) and len(search.tries) <= MAX_TRIES
    assert all("still failed" in product.why for product in search.fp32)

    def failed(manifest):  # the variant as export records one whose gate failed at every bucket
        variant = manifest.precisions["int8"]
        for measured in variant.gate.values():
            measured.failures = impossible.failures(measured)
        variant.passed, variant.search = False, search
        manifest.precisions.pop("bf16", None)
        manifest.precisions.pop("int8-openvino", None)

    tampered = read_manifest(_tampered_copy(export_dir, tmp_path, failed))
    for flags in (ZEN4, SKYLAKE, SAPPHIRE_RAPIDS):
        statuses = variant_statuses(tampered, flags, cpu_description())
        choice = choose_precision("auto", flags, statuses, tampered.buckets, tampered.latency, cpu_description())
        assert set(choice.by_bucket.values()) == {"fp32"}, choice.explain()
        with pytest.raises(PrecisionUnavailable):
            choose_precision("int8", flags, statuses, tampered.buckets)


@pytest.mark.slow
def test_int8_with_8_bit_weights_is_not_served_where_int8_products_saturate_unless_its_gate_ran_on_that_cpu(
    variant_exports,
):
    from export.manifest import read_manifest

    manifest = read_manifest(variant_exports["cls"])
    seven_bit = manifest.precisions["int8"]
    assert seven_bit.weight_bits == 7 and seven_bit.passed, "the tiny classifier's int8 passes its gate"
    eight_bit = manifest.model_copy(deep=True)
    eight_bit.precisions["int8"].search = None  # as written before the search: 8-bit weights
    elsewhere = "Intel Xeon (AVX512-VNNI)"
    assert eight_bit.precisions["int8"].measured_on != elsewhere
    for flags, cpu, served in [
        (SKYLAKE, elsewhere, False),  # AVX2 pairs saturate, and the gate ran on another CPU
        (SKYLAKE, eight_bit.precisions["int8"].measured_on, True),  # the gate measured these very kernels
        (ZEN4, elsewhere, True),  # VNNI: exact products
        (SAPPHIRE_RAPIDS, elsewhere, True),  # AMX-INT8: exact products
    ]:
        status = variant_statuses(eight_bit, flags, cpu)["int8"]
        assert status.passed_at(128) == served, (flags, cpu, status)
        if not served:
            assert "saturate" in status.detail and elsewhere not in status.detail
    for flags in (SKYLAKE, ZEN4, SAPPHIRE_RAPIDS):  # 7-bit weights: exact everywhere, served wherever it passed
        unsigned = manifest.model_copy(deep=True)
        unsigned.precisions["int8"].search.ssm_inputs_signed = False
        assert variant_statuses(unsigned, flags, elsewhere)["int8"].passed_at(128)
    # the SSM convolutions' signed inputs times 8-bit constants (written where export ran on VNNI): the same rule
    signed = manifest.model_copy(deep=True)
    signed.precisions["int8"].search.ssm_convolutions = signed.precisions["int8"].search.ssm_inputs_signed = True
    for flags, cpu, served in [
        (SKYLAKE, elsewhere, False),
        (SKYLAKE, signed.precisions["int8"].measured_on, True),
        (ZEN4, elsewhere, True),
        (SAPPHIRE_RAPIDS, elsewhere, True),
    ]:
        status = variant_statuses(signed, flags, cpu)["int8"]
        assert status.passed_at(128) == served, (flags, cpu, status)
        if not served:
            assert "SSM convolutions' 8-bit constants times signed inputs saturate" in status.detail, status.detail


@pytest.mark.parametrize(
    ("buckets", "searched"),
    [([128, 256, 512, 1024, 4096], [128, 512]), ([128, 4096], [128]), ([64, 300], [64, 300]), ([1024], [1024])],
)
def test_the_search_gates_at_the_shortest_bucket_and_the_longest_other_up_to_512(buckets, searched):
    from export.int8_search import search_buckets

    assert search_buckets(buckets) == searched


@pytest.mark.slow
def test_int8_ssm_convolutions_take_every_ssm_product_toeplitz_and_chunked_and_the_tanh_gelu_is_orts_within_the_gate(
    exports, tokenizer, tmp_path
):
    """Two int8 levers (export/int8_recipe.py `Int8Recipe`): the SSM convolutions quantized too, every constant-left
    product (up to 512 the Toeplitz T, one (L, L) per SSM; beyond, the chunked form's constants), and GELU in
    ORT's tanh form. Each answers within the gate of the fp32 graph."""
    import onnx
    import onnxruntime as ort

    from export.gate import GateThresholds, measure_gate, ort_runner
    from export.int8_recipe import Int8Recipe, constant_left_matmuls, write_int8_graph
    from export.manifest import read_manifest

    export_dir = exports["mlm"]
    manifest = read_manifest(export_dir)
    layers = json.loads((export_dir / "config.json").read_text())["num_hidden_layers"]
    recipe = Int8Recipe(ssm_convolutions=True, gelu_approximation=True)
    for bucket in manifest.buckets:
        src = export_dir / manifest.onnx.buckets[bucket].file
        constant_left = constant_left_matmuls(src)
        if bucket <= 512:  # Toeplitz: one constant (L, L) per SSM, two SSMs a layer
            assert len(constant_left) == 2 * layers, bucket
        else:  # chunked: several constants per SSM (intra, to_state, carry, read)
            assert len(constant_left) > 2 * layers, bucket
        optimized = tmp_path / f"{bucket}.onnx"
        write_int8_graph(src, optimized, recipe)
        ops = [n.op_type for n in onnx.load(str(optimized), load_external_data=False).graph.node]
        # every block's fused BiasGelu; the MLM head's transform keeps ONNX's own Gelu, which ORT's pass skips
        assert "FastGelu" in ops and "BiasGelu" not in ops, bucket
        # no product left fp32: each SSM convolution became ORT's int8 product with a constant left operand
        assert "MatMul" not in ops, (bucket, ops)
        if bucket in (min(manifest.buckets), max(manifest.buckets)):  # the Toeplitz form and the chunked one
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            session = ort.InferenceSession(str(optimized), options, providers=["CPUExecutionProvider"])
            reference = ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
            measured = measure_gate(tokenizer, bucket, "fill-mask", ort_runner({bucket: reference}),
                                    ort_runner({bucket: session}), GateThresholds())  # fmt: skip
            assert measured.embedding_cosine_min > 0.99, measured


def _convolution_inputs(path) -> dict[str, str]:
    """In a quantized graph: each constant-left integer product's quantized input → the op that writes it
    (ORT's DynamicQuantizeLinear; an int8 QuantizeLinear where `signed_convolution_inputs` rewrote it)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {init.name for init in graph.initializer}
    producer = {out: node.op_type for node in graph.node for out in node.output}
    return {
        node.input[1]: producer[node.input[1]]
        for node in graph.node
        if node.op_type in ("MatMulInteger", "MatMulIntegerToFloat") and node.input[0] in constants
    }


@pytest.mark.slow
def test_the_ssm_convolutions_signed_inputs_answer_exactly_as_orts_unsigned_ones_where_int8_sums_are_int32(
    exports, tokenizer, tmp_path
):
    """ORT quantizes every activation to uint8, which with the SSM's constant on the left makes a u8·u8 product
    (16-bit multiplies in MLAS). `Int8Recipe.ssm_signed_inputs` quantizes those inputs to the same values less
    128, as int8 (u8·s8, the fast kernels): every convolution's input is int8, Toeplitz and chunked, and on a
    CPU that sums int8 products in int32 (VNNI, AMX) every answer is exactly ORT's own form's. Elsewhere (AVX2's
    int16 pair sums) the 8-bit constants can saturate, which is why export writes the form only there."""
    import onnxruntime as ort

    from export.cpu import has_exact_int8_products
    from export.gate import gate_batches
    from export.int8_recipe import Int8Recipe, quantize_int8, write_int8_graph
    from export.manifest import read_manifest

    export_dir = exports["mlm"]
    manifest = read_manifest(export_dir)
    unsigned = Int8Recipe(ssm_convolutions=True, gelu_approximation=True)
    signed = Int8Recipe(ssm_convolutions=True, gelu_approximation=True, ssm_signed_inputs=True)
    sessions = {}
    for bucket in (min(manifest.buckets), max(manifest.buckets)):  # the Toeplitz form and the chunked one
        src = export_dir / manifest.onnx.buckets[bucket].file
        for form, recipe, quantizer in (("signed", signed, "QuantizeLinear"), ("unsigned", unsigned, "DynamicQuantizeLinear")):  # fmt: skip
            quantize_int8(src, tmp_path / f"{bucket}.{form}.raw.onnx", recipe)
            inputs = _convolution_inputs(tmp_path / f"{bucket}.{form}.raw.onnx")
            assert inputs and set(inputs.values()) == {quantizer}, (bucket, form, inputs)
            write_int8_graph(src, tmp_path / f"{bucket}.{form}.onnx", recipe)
            path = str(tmp_path / f"{bucket}.{form}.onnx")
            sessions[bucket, form] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    if not has_exact_int8_products():
        pytest.skip("this CPU sums int8 products in int16 (no VNNI or AMX-INT8): the signed form is not exact here")
    for bucket in (min(manifest.buckets), max(manifest.buckets)):
        wanted = {i.name for i in sessions[bucket, "signed"].get_inputs()}
        for feeds in gate_batches(tokenizer, bucket, fill_mask=True)[:2]:
            feeds = {k: v for k, v in feeds.items() if k in wanted}
            got, expected = (sessions[bucket, form].run(None, feeds) for form in ("signed", "unsigned"))
            for a, b in zip(got, expected, strict=True):
                np.testing.assert_array_equal(a, b)


def test_an_input_that_also_feeds_a_weight_product_keeps_orts_unsigned_quantization(tmp_path):
    """A weight product's activation is the LEFT operand and must stay uint8 (u8·s8): an input with any use other
    than a convolution's right operand is left as ORT quantized it; one used by convolutions alone is signed,
    and only where the recipe asks."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.int8_recipe import Int8Recipe, quantize_int8

    rng = np.random.default_rng(0)
    T, W = np.tril(rng.standard_normal((8, 8))).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    shared, alone = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8, 4]) for n in ("shared", "alone"))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8, 4]) for n in ("a", "b", "c")]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["T", "shared"], ["a"], name="convolution_of_shared"),
            helper.make_node("MatMul", ["shared", "W"], ["b"], name="weight_product_of_shared"),
            helper.make_node("MatMul", ["T", "alone"], ["c"], name="convolution_of_alone"),
        ],
        "g",
        [shared, alone],
        outputs,
        [numpy_helper.from_array(T, "T"), numpy_helper.from_array(W, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), tmp_path / "g.onnx")
    quantize_int8(
        tmp_path / "g.onnx", tmp_path / "g.int8.onnx", Int8Recipe(ssm_convolutions=True, ssm_signed_inputs=True)
    )
    inputs = _convolution_inputs(tmp_path / "g.int8.onnx")
    assert sorted(inputs.values()) == ["DynamicQuantizeLinear", "QuantizeLinear"], inputs
    assert next(v for k, v in inputs.items() if k.startswith("alone")) == "QuantizeLinear", inputs
    quantize_int8(tmp_path / "g.onnx", tmp_path / "g.ort.onnx", Int8Recipe(ssm_convolutions=True))
    assert set(_convolution_inputs(tmp_path / "g.ort.onnx").values()) == {"DynamicQuantizeLinear"}


def test_a_signed_convolution_input_holds_orts_uint8_values_less_128_and_the_same_scale_on_any_cpu(tmp_path):
    """`signed_convolution_inputs` quantizes a convolution's input again as int8 with ORT's scale and its zero
    point less 128: the values, the zero point and the scale a convolution reads are ORT's, less 128, exactly, on
    inputs that reach both ends of the range (elementwise ops: the same on every CPU)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from export.int8_recipe import Int8Recipe, quantize_int8

    rng = np.random.default_rng(1)
    T = np.tril(rng.standard_normal((64, 64))).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8])
    graph = helper.make_graph([helper.make_node("MatMul", ["T", "x"], ["y"], name="convolution")], "g", [x], [y],
                              [numpy_helper.from_array(T, "T")])  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), tmp_path / "g.onnx")
    read, feeds = {}, (rng.standard_normal((1, 64, 8)) * 5, rng.uniform(0.5, 3, (1, 64, 8)))
    for form, signed in (("signed", True), ("ort", False)):
        path = tmp_path / f"g.{form}.onnx"
        quantize_int8(tmp_path / "g.onnx", path, Int8Recipe(ssm_convolutions=True, ssm_signed_inputs=signed))
        model = onnx.load(str(path))
        product = next(n for n in model.graph.node if n.op_type == "MatMulInteger")
        quantizer = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear")
        exposed = [product.input[1], quantizer.output[1], product.input[3]]  # values, scale, zero point
        model.graph.output.extend(onnx.ValueInfoProto(name=name) for name in exposed)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for case, feed in enumerate(feeds):
            read[form, case] = session.run(exposed, {"x": feed.astype(np.float32)})
    for case in (0, 1):
        (values, scale, zero), (ort_values, ort_scale, ort_zero) = read["signed", case], read["ort", case]
        assert values.dtype == zero.dtype == np.int8 and ort_values.dtype == np.uint8
        np.testing.assert_array_equal(values.astype(np.int16), ort_values.astype(np.int16) - 128)
        np.testing.assert_array_equal(zero.astype(np.int16), ort_zero.astype(np.int16) - 128)
        assert scale == ort_scale and ort_values.max() == 255 and (case == 1 or ort_values.min() == 0)  # both ends


@pytest.mark.parametrize(
    ("flags", "exact"),
    [(SKYLAKE, False), ({"avx2"}, False), (ZEN4, True), (SAPPHIRE_RAPIDS, True), ({"avx2", "avx_vnni"}, True)],
)
def test_int8_sums_are_exact_at_8_bits_only_with_vnni_or_amx_int8(flags, exact):
    from export.cpu import has_exact_int8_products

    assert has_exact_int8_products(frozenset(flags)) == exact


@pytest.mark.slow
def test_the_int8_recipe_rebuilt_from_the_manifest_makes_the_served_graph_again_and_each_lever_stays_near_it(
    variant_exports, tokenizer, tmp_path
):
    """`bigs bench precision`'s lever columns start from the dir's own int8 recipe (export/int8_search.py
    `export_recipe`: the products left fp32 and the smoothing factors, computed again from the manifest's
    search record): quantized and optimised as export does, it answers exactly as the served int8 graph.
    The lever columns differ from it by the levers alone, within the gate's cosine; the one whose levers are
    the search's is the served graph again (at the buckets the search gated, where export keeps its levers)."""
    import onnxruntime as ort

    from bench.precision import LEVERS, add_levers
    from export.gate import gate_batches, ort_runner, ort_sessions
    from export.int8_recipe import write_int8_graph
    from export.int8_search import export_recipe
    from export.manifest import read_manifest
    from export.onnx_runtime import session_options

    export_dir = variant_exports["mlm"]
    manifest = read_manifest(export_dir)
    bucket = min(manifest.buckets)
    recipe = export_recipe(export_dir, manifest, tokenizer)
    assert recipe.fp32_weights == {p.weight for p in manifest.precisions["int8"].search.fp32}
    again = tmp_path / "again.onnx"
    write_int8_graph(export_dir / manifest.onnx.buckets[bucket].file, again, recipe)
    rebuilt = ort.InferenceSession(str(again), session_options(manifest), providers=["CPUExecutionProvider"])
    served = ort_runner(ort_sessions(export_dir, manifest, "int8", buckets=[bucket]))
    columns = {}
    add_levers(export_dir, manifest, tokenizer, [bucket], tmp_path, lambda name, s: columns.update({name: s}))
    assert set(columns) == set(LEVERS)
    for feeds in gate_batches(tokenizer, bucket, fill_mask=True)[:2]:
        feeds.pop("_counts", None)
        expected = served(bucket, feeds)
        got = ort_runner({bucket: rebuilt})(bucket, feeds)
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
        for lever, sessions in columns.items():
            embeddings = ort_runner(sessions)(bucket, feeds)["embeddings"]
            if all(getattr(recipe, field) == value for field, value in LEVERS[lever].items()):
                np.testing.assert_array_equal(embeddings, expected["embeddings"], err_msg=lever)
            cosine = np.sum(embeddings * expected["embeddings"], -1) / (
                np.linalg.norm(embeddings, axis=-1) * np.linalg.norm(expected["embeddings"], axis=-1)
            )
            assert cosine.min() > 0.99, lever


@pytest.mark.slow
def test_a_longer_bucket_whose_own_gate_refuses_the_levers_is_written_without_them_and_the_record_says_so(
    variant_exports, tokenizer, tmp_path
):
    """Step 5 (export/int8_search.py `Int8Plan`): past the buckets the search gated, a bucket takes the lever
    only on its own gate's word, and does whether or not the search's buckets kept it. Under thresholds no
    variant meets, the 1,024 bucket's gate fails: its graph is written again by the recipe without levers (the
    same graph as that recipe gives), the failed gate is in the record, and `levers_at` says none; a bucket the
    search gated is written with the levers, ungated. Where the search's buckets refused the lever, 1,024 takes
    it where its own gate passes, and the record says which form its convolutions' inputs have."""
    import onnx

    from export.heads import primary_head
    from export.int8_recipe import Int8Recipe, write_int8_graph
    from export.int8_search import Int8Plan
    from export.manifest import GateThresholds, read_manifest

    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    record = manifest.precisions["int8"].search.model_copy(deep=True)
    record.long_buckets = {}
    record.ssm_convolutions = record.gelu_approximation = True
    recipe = Int8Recipe(ssm_convolutions=True, gelu_approximation=True)
    unreachable = GateThresholds(embedding_cosine_min=1.5)
    seen = []
    head = primary_head(manifest.model.architecture)
    plan = Int8Plan(recipe, record, tokenizer, head, unreachable, done=lambda b, t: seen.append(b))
    ops = lambda path: [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
    fp32 = {b: export_dir / manifest.onnx.buckets[b].file for b in (512, 1024)}

    plan.write(512, fp32[512], tmp_path / "512.onnx")
    assert "FastGelu" in ops(tmp_path / "512.onnx") and 512 not in record.long_buckets
    plan.write(1024, fp32[1024], tmp_path / "1024.onnx")
    tried = record.long_buckets[1024]
    assert seen == [1024] and not tried.passed and tried.gate.failures, tried
    assert (tried.ssm_convolutions, tried.gelu_approximation) == (True, True)
    assert record.levers_at(1024) == (False, False) and record.levers_at(512) == (True, True)
    written = ops(tmp_path / "1024.onnx")
    assert "FastGelu" not in written and "MatMul" in written  # the chunked SSM products fp32 again
    write_int8_graph(fp32[1024], tmp_path / "plain.onnx", recipe.without_levers())
    assert written == ops(tmp_path / "plain.onnx")

    # the other way: the search's buckets refused the lever, a longer bucket takes it on its own gate's word
    record.long_buckets = {}
    record.ssm_convolutions = record.gelu_approximation = record.ssm_inputs_signed = False
    signed = Int8Recipe(ssm_signed_inputs=True)
    Int8Plan(signed, record, tokenizer, head, GateThresholds()).write(1024, fp32[1024], tmp_path / "taken.onnx")
    tried = record.long_buckets[1024]
    assert (tried.ssm_convolutions, tried.gelu_approximation) == (True, False) and tried.passed, tried
    assert record.levers_at(1024) == (True, False) and record.levers_at(512) == (False, False)
    assert record.ssm_inputs_signed  # the form its convolutions' inputs take, for the service's int16 check
    assert "MatMul" not in ops(tmp_path / "taken.onnx")  # every chunked SSM product int8


@pytest.mark.slow
def test_the_search_buckets_int8_graphs_are_written_as_the_search_gated_them_not_quantized_again(
    variant_exports, tokenizer, tmp_path, monkeypatch
):
    """The int8 search leaves the chosen recipe's graph of each bucket it gated (`search_int8(keep=…)`), and
    export's `Int8Plan` writes those buckets from them: the same graph the recipe gives afresh, without a
    second quantization."""
    import onnx
    from onnx import numpy_helper

    import export.int8_search as int8_search
    from export.heads import primary_head
    from export.int8_recipe import write_int8_graph
    from export.int8_search import Int8Plan, search_buckets, search_int8
    from export.manifest import GateThresholds, read_manifest

    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    graphs = {b: export_dir / manifest.onnx.graph(b).file for b in search_buckets(manifest.buckets)}
    head = primary_head(manifest.model.architecture)
    (tmp_path / "kept").mkdir()
    found = search_int8(graphs, tokenizer, head, GateThresholds(), keep=tmp_path / "kept")
    recipe, record, kept = found.recipe, found.record, found.kept
    assert record.passed and sorted(kept) == sorted(graphs)
    for bucket, graph in graphs.items():
        write_int8_graph(graph, tmp_path / f"fresh-{bucket}.onnx", recipe)

    def quantized_again(*_):
        raise AssertionError("a bucket the search gated was quantized again")

    monkeypatch.setattr(int8_search, "write_int8_graph", quantized_again)
    plan = Int8Plan(recipe, record, tokenizer, head, GateThresholds(), searched_graphs=dict(kept))

    def contents(path):
        model = onnx.load(str(path))
        nodes = [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
        return nodes, {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    for bucket, graph in graphs.items():
        plan.write(bucket, graph, tmp_path / f"written-{bucket}.onnx")
        (nodes, weights), (fresh_nodes, fresh_weights) = (
            contents(tmp_path / f"{name}-{bucket}.onnx") for name in ("written", "fresh")
        )
        assert nodes == fresh_nodes and sorted(weights) == sorted(fresh_weights), bucket
        for name, array in weights.items():
            np.testing.assert_array_equal(array, fresh_weights[name], err_msg=f"{bucket}: {name}")


@pytest.mark.slow
def test_a_longer_bucket_whose_gate_fails_leaves_more_products_in_fp32_there_alone_and_names_them(
    variant_exports, tmp_path, tokenizer
):
    """Step 6 of the search (export/int8_search.py `Int8Plan`): at a bucket longer than the search's, where the
    levers and then the graph without them miss that bucket's gate, the next steps of the ranking are left in
    fp32 there alone, halved to the fewest that pass; the graph is written with those, and the manifest names
    them. The bar at 1,024 is set between what the search's own count and the ranking's largest step give."""
    from dataclasses import replace

    from export.gate import measure_gate, ort_runner, remembered
    from export.heads import primary_head
    from export.int8_recipe import write_int8_graph
    from export.int8_search import Int8Plan, _session, exclusion_counts, search_buckets, search_int8
    from export.manifest import GateThresholds, read_manifest

    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    graphs = {b: export_dir / manifest.onnx.graph(b).file for b in search_buckets(manifest.buckets)}
    head, long = primary_head(manifest.model.architecture), 1024
    found = search_int8(graphs, tokenizer, head, GateThresholds())
    recipe, record = found.recipe, found.record
    ranking, chosen = found.ranking, len(record.fp32)
    most = max(c for c in exclusion_counts(ranking) if c > chosen)
    fp32_graph = export_dir / manifest.onnx.graph(long).file
    reference = remembered(ort_runner({long: _session(fp32_graph)}))

    def cosine(count: int) -> float:
        weights = frozenset(r.weight for r in ranking[:count])
        write_int8_graph(fp32_graph, tmp_path / "probe.onnx", replace(recipe.without_levers(), fp32_weights=weights))
        run = ort_runner({long: _session(tmp_path / "probe.onnx")})
        return measure_gate(tokenizer, long, head, reference, run, GateThresholds()).embedding_cosine_min

    few, many = cosine(chosen), cosine(most)
    assert many > few, (few, many)  # more products in fp32, closer to fp32's answers
    bar = GateThresholds(embedding_cosine_min=(few + many) / 2, classification_agreement_min=0.0)
    plan = Int8Plan(recipe, record, tokenizer, head, bar, ranking=ranking)
    plan.write(long, fp32_graph, tmp_path / f"{long}.int8.onnx")

    assert not record.long_buckets[long].passed  # the levers first, refused by the bar
    more = record.long_products[long]
    assert more.tries[0].fp32_products == chosen and not more.tries[0].passed
    assert more.passed and chosen < more.chosen.fp32_products <= most
    assert all(not t.passed for t in more.tries if t.fp32_products < more.chosen.fp32_products)
    extra = ranking[chosen : more.chosen.fp32_products]
    assert [p.weight for p in more.fp32] == [r.weight for r in extra]
    assert [p.rank for p in more.fp32] == list(range(chosen + 1, more.chosen.fp32_products + 1))
    assert all(f"left fp32 at bucket {long} alone" in p.why for p in more.fp32)
    # the graph as written is the chosen try's, and the manifest's names are the products it leaves in fp32
    assert fp32_weight_products(tmp_path / f"{long}.int8.onnx") == {p.weight for p in record.fp32_at(long)}
    assert record.gated_graphs()[long] == more.chosen.gate
    assert record.fp32_at(min(graphs)) == record.fp32  # the search's own buckets keep the search's products


@pytest.mark.slow
def test_graph_profile_shows_int8_openvino_running_every_weight_product_in_int8_in_the_categories_of_orts_profile(
    variant_exports, capsys
):
    """`bigs bench graph-profile` at int8-openvino reads OpenVINO's own counters: every weight product runs as an
    int8 FullyConnected (the plugin quantizes the activations at run time; were it to decompress the weights, the
    variant would be bf16 under int8's name), the chunked SSM convolution's products are told apart as constant-left
    MatMuls, and every node's time is in one category. The same bucket at fp32 through ORT's profiler falls in the
    same categories (every CPU; the OpenVINO half needs VNNI or AMX-INT8)."""
    from bench.graph_profile import main, profile_export

    export_dir, bucket = variant_exports["cls"], 1024  # the chunked bucket: its SSM products are MatMuls
    on_ort = profile_export(export_dir, bucket, "fp32", runs=2).by_category()
    assert on_ort["weight MatMul"] > 0 and on_ort["SSM MatMul"] > 0 and on_ort["attention MatMul"] == 0
    if not int8_openvino_runs_here():
        pytest.skip("this CPU has no VNNI or AMX-INT8: OpenVINO would decompress the int8 weights")
    on_openvino = profile_export(export_dir, bucket, "int8-openvino", runs=2)
    products = [node for node in on_openvino.nodes if node.category == "weight MatMul"]
    assert products and {node.precision for node in products} == {"i8"}, {(n.name, n.precision) for n in products}
    categories = on_openvino.by_category()
    assert categories["SSM MatMul"] > 0 and categories["attention MatMul"] == 0
    assert sum(categories.values()) == pytest.approx(on_openvino.kernel_ms)
    assert on_openvino.kernel_ms > 0 and on_openvino.wall_ms > 0

    main([str(export_dir), "--bucket", str(bucket), "--precision", "int8-openvino", "--runs", "1"])
    printed = capsys.readouterr().out
    assert "| weight MatMul |" in printed and "| FullyConnectedCompressed |" in printed and "i8" in printed
