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
