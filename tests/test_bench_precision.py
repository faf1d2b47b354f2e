"""`bigs bench precision`: every way the project can run an export's graphs, side by side, each timed and held
to the accuracy gate (bench/precision.py), on the service's tiny fill-mask export (real ORT and OpenVINO)."""

from __future__ import annotations

import pytest

from bench.precision import LEVERS, NNCF_METHOD, OPENVINO_METHODS, WEIGHT_COMPRESSION_METHODS, _methods, measure
from export.manifest import read_manifest
from export.openvino_runtime import effective_precision, load_compiled, openvino_available


@pytest.mark.slow
def test_every_int8_method_is_a_column_timed_and_gated_beside_fp32(exports):
    export_dir = exports["mlm"]
    manifest = read_manifest(export_dir)
    bucket = min(manifest.buckets)
    table = measure(export_dir, [bucket], repeats=1, quantize=True, gate=True)
    expected = {"ort-fp32", *_methods()}
    if manifest.onnx.buckets[bucket].int8 is not None:  # the export's own int8 graphs, where it wrote them
        expected |= {"ort-int8", *LEVERS}  # and its recipe with each lever
    if openvino_available():
        expected |= {"ov-fp32", *OPENVINO_METHODS, NNCF_METHOD, *WEIGHT_COMPRESSION_METHODS}  # NNCF: a dev dependency
        # bf16 is a column only where OpenVINO really runs it at bf16; elsewhere the table says why not
        if any(effective_precision(c) == "bf16" for c in load_compiled(export_dir, "bf16", buckets=[bucket]).values()):
            expected.add("ov-bf16")
        else:
            assert "ov-bf16" not in table.median_ms
            assert "ov-bf16: not run, OpenVINO runs the bf16 hint at fp32" in table.markdown()
    assert expected <= set(table.median_ms)
    for name in expected:
        assert table.median_ms[name][bucket] > 0, name
        measured = table.gate[name][bucket]
        assert measured.sequences > 0 and -1.0 <= measured.embedding_cosine_min <= 1.0 + 1e-6, name
    # fp32 against itself is the same answer: the gate cannot fail it
    assert table.gate["ort-fp32"][bucket].passed
    header = table.markdown().splitlines()[2]
    assert all(f" {name} " in header for name in expected)


def test_int8_weights_are_nncfs_int8_sym_values_with_fp32_scales(exports):
    """`int8_weights` is NNCF's weight compression (INT8_SYM) without NNCF at run time: the same constants replaced,
    the same int8 values wherever NNCF's fp16 scale is a normal fp16 number (elsewhere NNCF's scale has lost the
    precision the fp32 one keeps), up to the rounding of that fp16 scale: one quantum, at few values."""
    nncf = pytest.importorskip("nncf")  # the dev extra's: the reference, not a dependency of the service
    import numpy as np
    import openvino as ov

    from export.openvino_runtime import int8_weights

    export_dir = exports["mlm"]
    manifest = read_manifest(export_dir)
    graph = str(export_dir / manifest.onnx.graph(max(manifest.buckets)).file)
    core = ov.Core()

    def compressed(model) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
        """(MatMul, port) → (int8 values, scales) of every int8 constant feeding a MatMul through Convert/Multiply"""
        found = {}
        for node in model.get_ops():
            if node.get_type_name() != "MatMul":
                continue
            for port in (0, 1):
                source = node.input_value(port).get_node()
                while source.get_type_name() == "Convert" and source.get_output_element_type(0) == ov.Type.f32:
                    source = source.input_value(0).get_node()  # NNCF's fp16 → fp32 after its Multiply
                if source.get_type_name() != "Multiply":
                    continue
                values, scale = (source.input_value(i).get_node() for i in (0, 1))
                while values.get_type_name() == "Convert":
                    values = values.input_value(0).get_node()
                if values.get_type_name() != "Constant" or values.get_output_element_type(0) != ov.Type.i8:
                    continue  # a Multiply of activations (the gates), not a weight's scale
                found[(node.get_friendly_name(), port)] = (values.get_data(), scale.get_data().astype(np.float32))
        return found

    ours = core.read_model(graph)
    replaced = int8_weights(ours)
    reference = nncf.compress_weights(core.read_model(graph), mode=nncf.CompressWeightsMode.INT8_SYM)
    ours_by_product, nncf_by_product = compressed(ours), compressed(reference)
    assert replaced == len(ours_by_product) > 0
    assert set(ours_by_product) == set(nncf_by_product)
    compared = 0
    for product, (values, scale) in ours_by_product.items():
        assert scale.dtype == np.float32
        nncf_values, nncf_scale = nncf_by_product[product]
        if values.shape != nncf_values.shape:  # NNCF may store a weight transposed (and its MatMul flag with it)
            nncf_values, nncf_scale = np.swapaxes(nncf_values, -1, -2), np.swapaxes(nncf_scale, -1, -2)
        if np.abs(nncf_scale).min() < np.finfo(np.float16).tiny:
            continue
        compared += 1
        differ = values.astype(np.int16) != nncf_values.astype(np.int16)
        assert np.abs(values.astype(np.int16) - nncf_values)[differ].max(initial=0) <= 1, product
        assert differ.mean() < 0.01, product
        np.testing.assert_allclose(scale, nncf_scale, rtol=1e-3)  # fp16 keeps 11 bits
    assert compared >= len(ours_by_product) // 2
