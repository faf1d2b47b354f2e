"""`bigs export` without --precisions: the variants this machine runs, gated and timed, and `auto` over them.

It writes, gates and times the variants this machine runs (and `--precisions none` none); `auto` with the
latency recorded on this CPU serves per bucket the fastest variant that passed there, with a record of
another CPU (or none, as in an older manifest) the order for this CPU's flags, and its reasons say which.
The latency record runs a short bucket on until its time is spent and a long one its minimum runs.
"""

from __future__ import annotations

import json

import pytest
from precision_fixtures import _int8_first_then_fp32, _with_latency

from export.precisions import REDUCED
from service.precision_policy import (
    OPENVINO_BUCKETS,
    OPENVINO_MIN_SPEEDUP,
    choose_precision,
    cpu_flags,
    precision_for_model,
    preference,
    variant_statuses,
)


@pytest.mark.slow
def test_export_without_flags_writes_gates_and_times_the_variants_this_machine_runs(default_exports):
    from export.build import default_precisions
    from export.cpu import cpu_description, has_bf16_units, has_exact_int8_products
    from export.manifest import read_manifest
    from export.openvino_runtime import openvino_available

    assert ("bf16" in default_precisions()) == (has_bf16_units() and openvino_available())
    assert ("int8-openvino" in default_precisions()) == (has_exact_int8_products() and openvino_available())
    for name in ("cls", "mlm"):
        manifest = read_manifest(default_exports[name])
        assert tuple(manifest.precisions) == default_precisions(), name
        for variant in manifest.precisions.values():
            assert sorted(variant.gate) == manifest.buckets and variant.passed is not None
        assert all(graph.int8 is not None for graph in manifest.onnx.buckets.values())
        # the latency of fp32 and of each variant at each bucket, with the CPU that measured it
        latency = manifest.latency
        assert latency.measured_on == cpu_description()
        assert list(latency.ms) == ["fp32", *manifest.precisions]
        for figures in latency.ms.values():
            assert sorted(figures) == manifest.buckets and all(ms > 0 for ms in figures.values())
    fp32_only = read_manifest(default_exports["cls-none"])
    assert fp32_only.precisions == {} and fp32_only.latency is None and fp32_only.gate is None
    assert all(graph.int8 is None for graph in fp32_only.onnx.buckets.values())


@pytest.mark.slow
def test_a_manifest_written_before_latency_was_recorded_still_loads_and_auto_says_it_goes_by_the_flags(
    default_exports, tmp_path
):
    import shutil

    from export.manifest import read_manifest

    old = tmp_path / "old"
    shutil.copytree(default_exports["cls"], old)
    raw = json.loads((old / "manifest.json").read_text())
    del raw["latency"]
    (old / "manifest.json").write_text(json.dumps(raw))
    manifest = read_manifest(old)
    assert manifest.latency is None
    choice = precision_for_model("auto", "onnx", manifest)
    by_flags = choose_precision("auto", cpu_flags(), variant_statuses(manifest), manifest.buckets)
    assert choice == by_flags
    if choice.precision != "fp32":  # a reduced precision served by the order for this CPU's flags
        assert "(no latency record for this CPU)" in choice.explain(), choice.explain()


@pytest.mark.slow
def test_auto_with_this_cpus_latency_record_serves_per_bucket_the_fastest_variant_that_passed(
    default_exports, tmp_path
):
    from export.manifest import read_manifest

    manifest = read_manifest(default_exports["cls"])
    assert manifest.precisions["int8"].passed, manifest.precisions["int8"].failures()
    # the figures export recorded: at each bucket the fastest of fp32 and the variants that passed there, OpenVINO's
    # at the OPENVINO_BUCKETS where it saves the most ms, OPENVINO_MIN_SPEEDUP faster or more
    recorded = manifest.latency.ms
    passing = [p for p, v in manifest.precisions.items() if v.passed]
    # equal figures (a tiny model's, rounded to the microsecond) go as auto breaks ties: the flags' preference,
    # then the other reduced precisions, fp32 last
    tie_order = [*dict.fromkeys(p for p in (*preference(cpu_flags()), *REDUCED) if p in passing), "fp32"]
    fastest = {b: min(tie_order, key=lambda p, b=b: recorded[p][b]) for b in manifest.buckets}
    everywhere = {"openvino_buckets": len(manifest.buckets), "openvino_min_speedup": 1.0}
    assert precision_for_model("auto", "onnx", manifest, **everywhere).by_bucket == fastest
    on_ort = [p for p in tie_order if p not in ("bf16", "int8-openvino")]
    one_copy = {b: min(on_ort, key=lambda p, b=b: recorded[p][b]) for b in manifest.buckets}
    on_openvino = {
        b: min([p for p in tie_order if p not in on_ort], key=lambda p, b=b: recorded[p][b], default=None)
        for b in one_copy
    }
    saves = {b: recorded[p][b] - recorded[on_openvino[b]][b] for b, p in one_copy.items()
             if on_openvino[b] and recorded[on_openvino[b]][b] * OPENVINO_MIN_SPEEDUP < recorded[p][b]}  # fmt: skip
    top = sorted(saves, key=saves.get, reverse=True)[:OPENVINO_BUCKETS]
    expected = {b: on_openvino[b] if b in top else p for b, p in one_copy.items()}
    assert precision_for_model("auto", "onnx", manifest).by_bucket == expected
    # figures that decide differently per bucket, whatever this CPU's flags would prefer
    tampered = read_manifest(_with_latency(default_exports["cls"], tmp_path, ms=_int8_first_then_fp32(manifest)))
    choice = precision_for_model("auto", "onnx", tampered)
    assert choice.by_bucket == {128: "int8", 512: "fp32"}, choice.explain()
    assert "int8 at 128: fastest measured on this CPU (2 ms vs " in choice.explain()
    assert "fp32 at 512: fastest measured on this CPU (10 ms vs " in choice.explain()


def test_the_latency_record_runs_a_short_bucket_on_until_its_time_is_spent_and_a_long_one_its_minimum_runs():
    """export/latency.py `interleaved_ms`, as the record calls it: runs that take no time are repeated up to the cap (a 128-token bucket gets
    many runs, so one neighbour's burst cannot decide `auto`), runs that fill the time get the minimum, and every
    candidate is called as often as the others (interleaved), one warm-up included."""
    import time

    from export.latency import interleaved_ms

    calls = {"fp32": 0, "int8": 0}

    def counted(name, seconds=0.0):
        def run():
            calls[name] += 1
            if seconds:
                time.sleep(seconds)

        return run

    interleaved_ms({name: counted(name) for name in calls}, repeats=5, min_seconds=1e9, max_repeats=17)
    assert calls == {"fp32": 18, "int8": 18}
    calls.update(fp32=0, int8=0)
    interleaved_ms({name: counted(name, 0.01) for name in calls}, repeats=5, min_seconds=0.0, max_repeats=17)
    assert calls == {"fp32": 6, "int8": 6}


@pytest.mark.slow
def test_auto_with_a_latency_record_from_another_cpu_falls_back_to_the_order_for_this_cpus_flags(
    default_exports, tmp_path
):
    from export.manifest import read_manifest

    manifest = read_manifest(default_exports["cls"])
    other = "Another CPU (no VNNI, BF16 or AMX)"
    elsewhere = read_manifest(
        _with_latency(default_exports["cls"], tmp_path, ms=_int8_first_then_fp32(manifest), measured_on=other)
    )
    choice = precision_for_model("auto", "onnx", elsewhere)
    by_flags = choose_precision("auto", cpu_flags(), variant_statuses(elsewhere), elsewhere.buckets)
    assert choice.by_bucket == by_flags.by_bucket, choice.explain()
    assert "fastest measured" not in choice.explain()
    if choice.precision != "fp32":
        assert f"(latency was measured on another CPU, {other})" in choice.explain(), choice.explain()
