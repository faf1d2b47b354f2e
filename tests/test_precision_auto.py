"""Which precision `auto` serves, for which CPU: `choose_precision` (a pure function) over a table of CPUs.

- By the CPU's flags (as Linux names them) and the variants' gates: the fastest variant that passed its gate
  and this CPU runs fast; per bucket, a variant that failed its gate at one bucket is served at the others,
  fp32 there; a reason for every candidate passed over; an explicit precision served whatever the CPU, or
  refused where the dir lacks it or its gate failed; other runtimes serve fp32.
- By the latency export measured on this CPU: per bucket the fastest variant that passed there, OpenVINO
  only at the buckets where it saves the most time and beyond the record's noise (the bucket count and
  the minimum speedup are service settings); a record of another CPU, none or an incomplete one: the flags.
"""

from __future__ import annotations

import pytest
from precision_fixtures import ALDER_LAKE, SAPPHIRE_RAPIDS, SKYLAKE, ZEN4

from service.precision_policy import (
    OPENVINO_BUCKETS,
    OPENVINO_MIN_SPEEDUP,
    PrecisionUnavailable,
    VariantStatus,
    choose_precision,
    cpu_flags,
    dominant_precision,
    precision_for_model,
)

PASSED = VariantStatus(present=True, passed=True)
FAILED = VariantStatus(present=True, passed=False, detail="bucket 128: embedding cosine (min) 0.9 < 0.99")
ABSENT = VariantStatus(present=False)

BUCKETS = [128, 512, 1024, 4096]


def failing_at(*failing: int) -> VariantStatus:
    """A variant whose recorded gate failed at `failing` buckets only (passed at the other BUCKETS)."""
    failures = {b: (f"max abs logit diff 2.{b % 7} > 2" if b in failing else "") for b in BUCKETS}
    first = min(failing)
    return VariantStatus(
        present=True, passed=False, detail=f"bucket {first}: {failures[first]}", bucket_failures=failures
    )


# (cpu flags, int8 status, bf16 status) → precision auto serves
AUTO_CASES = {
    "amx: bf16 first": (SAPPHIRE_RAPIDS, PASSED, PASSED, "bf16"),
    "amx, bf16 failed its gate: int8": (SAPPHIRE_RAPIDS, PASSED, FAILED, "int8"),
    "amx, no bf16 variant: int8": (SAPPHIRE_RAPIDS, PASSED, ABSENT, "int8"),
    "amx, nothing passed: fp32": (SAPPHIRE_RAPIDS, FAILED, FAILED, "fp32"),
    "zen 4 (vnni, avx512_bf16, no amx): int8": (ZEN4, PASSED, PASSED, "int8"),
    "zen 4, int8 failed: not bf16 either (no amx)": (ZEN4, FAILED, PASSED, "fp32"),
    "avx-vnni only: int8": (ALDER_LAKE, PASSED, PASSED, "int8"),
    "no vnni, avx2: int8 (7-bit weights, exact there)": (SKYLAKE, PASSED, PASSED, "int8"),
    "no vnni, avx2, int8 failed: fp32": (SKYLAKE, FAILED, PASSED, "fp32"),
    "no cpuinfo: fp32": (set(), PASSED, PASSED, "fp32"),
    "fp32-only export: fp32": (ZEN4, ABSENT, ABSENT, "fp32"),
}


@pytest.mark.parametrize("case", list(AUTO_CASES))
def test_auto_serves_the_fastest_variant_that_passed_its_gate_and_this_cpu_runs_fast(case):
    flags, int8, bf16, expected = AUTO_CASES[case]
    choice = choose_precision("auto", flags, {"int8": int8, "bf16": bf16}, BUCKETS)
    assert choice.precision == expected, choice.explain()
    assert choice.by_bucket == dict.fromkeys(BUCKETS, expected)
    assert choice.reasons and choice.reasons[-1].startswith(expected), choice.reasons


def test_auto_gives_a_reason_for_every_candidate_it_passed_over():
    choice = choose_precision("auto", SAPPHIRE_RAPIDS, {"int8": FAILED, "bf16": ABSENT}, BUCKETS)
    assert choice.precision == "fp32"
    assert choice.reasons == [
        "not bf16: no bf16 variant",
        f"not int8: failed its accuracy gate ({FAILED.detail})",
        "fp32: no faster variant applies",
    ]
    lacking = choose_precision("auto", {"sse4_2"}, {"int8": PASSED, "bf16": PASSED}, BUCKETS)
    assert "AVX512-VNNI or AVX-VNNI or AVX2" in lacking.explain() and "AMX-BF16" in lacking.explain()


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_an_explicit_precision_is_served_whatever_the_cpu_when_its_variant_passed(precision):
    choice = choose_precision(precision, set(), {precision: PASSED}, BUCKETS)
    assert choice.precision == precision and "no flag that makes it fast" in choice.explain()
    assert choose_precision("fp32", SAPPHIRE_RAPIDS, {"int8": PASSED, "bf16": PASSED}, BUCKETS).precision == "fp32"


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (ABSENT, "has no int8 variant"),
        (FAILED, "failed its accuracy gate"),
        (failing_at(4096), r"failed its accuracy gate \(bucket 4096: max abs logit diff"),
    ],
)
def test_an_explicit_precision_the_dir_lacks_or_that_failed_its_gate_at_any_bucket_is_refused(status, says):
    with pytest.raises(PrecisionUnavailable, match=says):
        choose_precision("int8", ZEN4, {"int8": status}, BUCKETS)


# (cpu flags, int8 status, bf16 status) → the precision auto serves at each of BUCKETS (128, 512, 1024, 4096)
PER_BUCKET_CASES = {
    "zen 4, int8 failed at 4096: int8 elsewhere, fp32 there": (
        ZEN4, failing_at(4096), PASSED, ["int8", "int8", "int8", "fp32"]),
    "zen 4, int8 failed at 128 and 4096": (ZEN4, failing_at(128, 4096), ABSENT, ["fp32", "int8", "int8", "fp32"]),
    "amx, bf16 failed at 4096: int8 there": (SAPPHIRE_RAPIDS, PASSED, failing_at(4096), ["bf16", "bf16", "bf16", "int8"]),
    "amx, both failed at 4096: fp32 there": (
        SAPPHIRE_RAPIDS, failing_at(4096), failing_at(4096), ["bf16", "bf16", "bf16", "fp32"]),
    "amx, bf16 failed at 128, int8 at 4096": (
        SAPPHIRE_RAPIDS, failing_at(4096), failing_at(128), ["int8", "bf16", "bf16", "bf16"]),
    "amx, bf16 failed at every bucket, int8 at 4096": (
        SAPPHIRE_RAPIDS, failing_at(4096), failing_at(*BUCKETS), ["int8", "int8", "int8", "fp32"]),
    "zen 4, int8 failed at every bucket: fp32 (bf16 not fast)": (
        ZEN4, failing_at(*BUCKETS), PASSED, ["fp32"] * 4),
    "no vnni, avx2: int8 where it passed": (SKYLAKE, failing_at(4096), PASSED, ["int8", "int8", "int8", "fp32"]),
    "no avx2 either: fp32 even where int8 passed": ({"sse4_2"}, failing_at(4096), PASSED, ["fp32"] * 4),
}  # fmt: skip


@pytest.mark.parametrize("case", list(PER_BUCKET_CASES))
def test_auto_serves_at_each_bucket_the_fastest_variant_whose_gate_passed_at_that_bucket(case):
    flags, int8, bf16, expected = PER_BUCKET_CASES[case]
    choice = choose_precision("auto", flags, {"int8": int8, "bf16": bf16}, BUCKETS)
    assert choice.by_bucket == dict(zip(BUCKETS, expected, strict=True)), choice.explain()
    assert choice.precision == (expected[0] if len(set(expected)) == 1 else "mixed")


def test_a_mixed_choice_names_each_precisions_buckets_and_the_bucket_and_measure_that_ruled_a_variant_out():
    int8 = failing_at(4096)
    choice = choose_precision("auto", ZEN4, {"int8": int8, "bf16": PASSED}, BUCKETS)
    assert choice.explain() == (
        "precision auto: int8 at 128, 512, 1024 (its gate passed there; preferred for CPUs with AVX512-VNNI: "
        "no latency record for this CPU); "
        "not bf16: this CPU lacks AMX-BF16; "
        f"fp32 at 4096 (int8 failed its gate there: {int8.bucket_failures[4096]})"
    )
    two = failing_at(128, 4096)
    amx = choose_precision("auto", SAPPHIRE_RAPIDS, {"int8": two, "bf16": failing_at(*BUCKETS)}, BUCKETS)
    assert amx.reasons == [
        "not bf16: failed its accuracy gate (bucket 128: max abs logit diff 2.2 > 2)",
        "int8 at 512, 1024 (its gate passed there; preferred for CPUs with AMX-INT8: no latency record for this CPU)",
        "fp32 at 128, 4096 (int8 failed its gate: at 128: max abs logit diff 2.2 > 2, "
        "at 4096: max abs logit diff 2.1 > 2)",
    ]


def test_a_field_of_one_precision_gets_the_precision_of_most_buckets_the_shortest_breaking_ties():
    assert dominant_precision({128: "int8", 512: "int8", 1024: "int8", 4096: "fp32"}) == "int8"
    assert dominant_precision({128: "fp32", 512: "int8", 1024: "int8", 4096: "fp32"}) == "fp32"
    assert dominant_precision({512: "fp32", 128: "int8"}) == "int8"


def test_other_runtimes_serve_fp32_and_refuse_an_explicit_reduced_precision():
    assert precision_for_model("auto", "torch", manifest=None).precision == "fp32"
    with pytest.raises(PrecisionUnavailable, match="needs runtime onnx"):
        precision_for_model("int8", "stablehlo", manifest=None)


def test_cpu_flags_are_read_from_the_cpuinfo_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu avx512_vnni amx_int8\n\nprocessor\t: 1\n"
    )
    assert cpu_flags(str(cpuinfo)) == {"fpu", "avx512_vnni", "amx_int8"}
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()


# -- auto by the latency export measured ----------------------------------------------------------

THIS_CPU = "Test CPU (AVX512-VNNI)"


def timed(**ms_by_precision: list[float]):
    """A latency record measured on THIS_CPU: precision → its ms at each of BUCKETS."""
    from export.manifest import LatencyRecord

    ms = {p: dict(zip(BUCKETS, values, strict=True)) for p, values in ms_by_precision.items()}
    return LatencyRecord(measured_on=THIS_CPU, how="test figures", ms=ms)


def test_auto_on_the_cpu_that_was_timed_serves_at_each_bucket_the_fastest_variant_that_passed_there():
    # bf16 failed its gate at 4096, where it measured fastest: the faster of the others serves there. The
    # CPU lacks AMX-BF16, which the order by flags would need for bf16: measured here, it is served anyway.
    record = timed(fp32=[5, 20, 30, 90], int8=[2, 25, 40, 60], bf16=[3, 10, 35, 50])
    variants = {"int8": PASSED, "bf16": failing_at(4096)}
    choice = choose_precision("auto", ZEN4, variants, BUCKETS, record, THIS_CPU)
    assert choice.by_bucket == {128: "int8", 512: "bf16", 1024: "fp32", 4096: "int8"}, choice.explain()
    assert choice.reasons == [
        "int8 at 128, 4096: fastest measured on this CPU (at 128: 2 ms vs bf16 3 ms, fp32 5 ms; "
        "at 4096: 60 ms vs fp32 90 ms); bf16 failed its gate at 4096: max abs logit diff 2.1 > 2",
        "bf16 at 512: fastest measured on this CPU, at the 2 buckets where it saves the most time a call "
        "(auto_openvino_buckets), 1.1x faster or more (auto_openvino_min_speedup) (10 ms vs int8 25 ms, fp32 20 ms)",
        "fp32 at 1024: fastest measured on this CPU (30 ms vs int8 40 ms, bf16 35 ms)",
    ]  # in the order of this CPU's preference, fp32 last
    # fp32 faster everywhere: fp32, although every variant passed
    slower = timed(fp32=[1, 1, 1, 1], int8=[2, 2, 2, 2], bf16=[3, 3, 3, 3])
    assert (
        choose_precision("auto", ZEN4, {"int8": PASSED, "bf16": PASSED}, BUCKETS, slower, THIS_CPU).precision == "fp32"
    )


def test_auto_serves_openvino_at_the_buckets_where_it_saves_the_most_time_and_only_beyond_the_records_noise():
    # int8-openvino beats int8 by 1.04x at 128, 1.25x at 512 (2 ms a call), 1.21x at 1024 (7 ms) and 1.33x at
    # 4096 (20 ms): a second runtime, with memory of its own per bucket, serves the two buckets that save the most
    record = timed(fp32=[10, 20, 80, 160], int8=[5, 10, 40, 80], **{"int8-openvino": [4.8, 8, 33, 60]})
    variants = {"int8": PASSED, "int8-openvino": PASSED}
    choice = choose_precision("auto", ZEN4, variants, BUCKETS, record, THIS_CPU)
    assert OPENVINO_BUCKETS == 2 and OPENVINO_MIN_SPEEDUP == 1.1
    assert choice.by_bucket == {128: "int8", 512: "int8", 1024: "int8-openvino", 4096: "int8-openvino"}
    assert choice.reasons == [
        "not bf16: no bf16 variant",
        "int8 at 128, 512: the fastest on the model's one copy of the weights (at 128: 5 ms vs int8-openvino 4.8 ms, "
        "fp32 10 ms; at 512: 10 ms vs int8-openvino 8 ms, fp32 20 ms); int8-openvino faster by 1.04x at 128, 1.25x "
        "at 512, but OpenVINO, with memory of its own per bucket, is taken at the 2 buckets where it saves the most "
        "time a call (auto_openvino_buckets), 1.1x faster or more (auto_openvino_min_speedup)",
        "int8-openvino at 1024, 4096: fastest measured on this CPU, at the 2 buckets where it saves the most time a "
        "call (auto_openvino_buckets), 1.1x faster or more (auto_openvino_min_speedup) (at 1024: 33 ms vs int8 40 "
        "ms, fp32 80 ms; at 4096: 60 ms vs int8 80 ms, fp32 160 ms)",
    ]

    def served_on_openvino(**rule) -> list[int]:
        by_bucket = choose_precision("auto", ZEN4, variants, BUCKETS, record, THIS_CPU, **rule).by_bucket
        return [b for b, p in by_bucket.items() if p == "int8-openvino"]

    assert served_on_openvino(openvino_buckets=1) == [4096]  # 20 ms a call, not 1024's 7
    assert served_on_openvino(openvino_buckets=9) == [512, 1024, 4096]  # not 128: 1.04x, within the noise
    assert served_on_openvino(openvino_buckets=9, openvino_min_speedup=1.0) == BUCKETS  # the fastest, whatever
    assert served_on_openvino(openvino_buckets=0) == []


def test_auto_measures_bf16_against_the_fastest_on_onnx_runtime_there_fp32_where_int8_failed():
    # bf16 saves 1, 2, 20 and 40 ms a call: it serves 1024 and 4096
    record = timed(fp32=[10, 20, 80, 160], int8=[5, 10, 40, 80], bf16=[4, 8, 20, 40])
    variants = {"int8": PASSED, "bf16": PASSED}
    choice = choose_precision("auto", ZEN4, variants, BUCKETS, record, THIS_CPU)
    assert choice.by_bucket == {128: "int8", 512: "int8", 1024: "bf16", 4096: "bf16"}, choice.explain()
    # int8 failed at 128: there bf16 saves 6 ms against fp32's 10, less than at 1024 and 4096; with three buckets, 128
    failed = {"int8": failing_at(128), "bf16": PASSED}
    assert choose_precision("auto", ZEN4, failed, BUCKETS, record, THIS_CPU).by_bucket[128] == "fp32"
    three = choose_precision("auto", ZEN4, failed, BUCKETS, record, THIS_CPU, openvino_buckets=3)
    assert three.by_bucket == {128: "bf16", 512: "int8", 1024: "bf16", 4096: "bf16"}, three.explain()


def test_auto_serves_int8_openvino_where_the_dir_has_it_by_the_same_rule_as_bf16_and_never_by_flags_alone():
    # int8-openvino (OpenVINO, a second runtime like bf16) is faster than bf16 at 1024 and 4096, the two buckets
    # where OpenVINO saves the most: the faster of OpenVINO's two is served there
    record = timed(
        fp32=[10, 20, 80, 160], int8=[5, 10, 40, 80], bf16=[4, 8, 30, 50], **{"int8-openvino": [4, 8, 20, 40]}
    )
    variants = {"int8": PASSED, "bf16": PASSED, "int8-openvino": PASSED}
    choice = choose_precision("auto", ZEN4, variants, BUCKETS, record, THIS_CPU)
    assert choice.by_bucket == {128: "int8", 512: "int8", 1024: "int8-openvino", 4096: "int8-openvino"}
    assert choice.reasons[0].startswith(
        "int8 at 128, 512: the fastest on the model's one copy of the weights (at 128: 5 ms vs bf16 4 ms, "
        "int8-openvino 4 ms, fp32 10 ms; at 512: 10 ms vs bf16 8 ms, int8-openvino 8 ms, fp32 20 ms); bf16 faster "
        "by 1.25x at 128, 1.25x at 512, but OpenVINO"
    )  # a tie between OpenVINO's two: the first in the flags' order names it
    assert choice.reasons[1].startswith("int8-openvino at 1024, 4096: fastest measured on this CPU, at the 2 buckets")
    # where its gate failed, bf16 is OpenVINO's candidate there (30 ms saved at 4096)
    failed = {**variants, "int8-openvino": failing_at(4096)}
    assert choose_precision("auto", ZEN4, failed, BUCKETS, record, THIS_CPU).by_bucket[4096] == "bf16"
    # no latency record of this CPU: the flags' order, which has no int8-openvino
    assert "int8-openvino" not in choose_precision("auto", ZEN4, variants, BUCKETS).by_bucket.values()
    assert "int8-openvino" not in choose_precision("auto", SAPPHIRE_RAPIDS, variants, BUCKETS).by_bucket.values()
    # a dir without it: nothing said of it
    without = choose_precision("auto", ZEN4, {"int8": PASSED, "bf16": PASSED}, BUCKETS, record, THIS_CPU)
    assert "int8-openvino" not in without.explain()
    # asked for, it is served at every bucket where its gate passed at every bucket
    assert choose_precision("int8-openvino", ZEN4, variants, BUCKETS).precision == "int8-openvino"


def test_the_openvino_rules_bucket_count_and_min_speedup_are_service_settings(monkeypatch):
    from service.settings import ServiceSettings

    settings = ServiceSettings()
    assert (settings.auto_openvino_buckets, settings.auto_openvino_min_speedup) == (2, 1.1)
    monkeypatch.setenv("BIGS_AUTO_OPENVINO_BUCKETS", "0")
    monkeypatch.setenv("BIGS_AUTO_OPENVINO_MIN_SPEEDUP", "1")
    assert (ServiceSettings().auto_openvino_buckets, ServiceSettings().auto_openvino_min_speedup) == (0, 1.0)
    with pytest.raises(ValueError):
        ServiceSettings(auto_openvino_min_speedup=0.5)  # below 1 would serve OpenVINO slower than the one-copy choice
    with pytest.raises(ValueError):
        ServiceSettings(auto_openvino_buckets=-1)


def test_auto_with_a_latency_record_of_another_cpu_none_or_an_incomplete_one_goes_by_the_cpus_flags():
    variants = {"int8": PASSED, "bf16": PASSED}
    by_flags = choose_precision("auto", SAPPHIRE_RAPIDS, variants, BUCKETS)
    assert by_flags.precision == "bf16"  # the order for AMX, although int8 measured faster below
    assert by_flags.reasons[-1] == (
        "bf16: preferred for CPUs with AMX-BF16 (no latency record for this CPU), and the variant passed its accuracy gate"
    )
    int8_fastest = timed(fp32=[9] * 4, int8=[1] * 4, bf16=[5] * 4)
    elsewhere = choose_precision("auto", SAPPHIRE_RAPIDS, variants, BUCKETS, int8_fastest, "Another CPU (AMX-BF16)")
    assert elsewhere.by_bucket == by_flags.by_bucket
    assert f"(latency was measured on another CPU, {THIS_CPU})" in elsewhere.explain()
    incomplete = int8_fastest.model_copy(update={"ms": {"fp32": {128: 9.0}, "int8": {128: 1.0}}})
    partial = choose_precision("auto", SAPPHIRE_RAPIDS, variants, BUCKETS, incomplete, THIS_CPU)
    assert partial.by_bucket == by_flags.by_bucket
    assert "the latency record has no fp32 figure at 512, 1024, 4096" in partial.explain()
    # the same record on its own CPU: measured, int8
    assert choose_precision("auto", SAPPHIRE_RAPIDS, variants, BUCKETS, int8_fastest, THIS_CPU).precision == "int8"


def test_an_explicit_precision_is_served_whatever_the_latency_record_says():
    fp32_fastest = timed(fp32=[1] * 4, int8=[9] * 4)
    assert choose_precision("int8", ZEN4, {"int8": PASSED}, BUCKETS, fp32_fastest, THIS_CPU).precision == "int8"
