"""Which precision to serve on this CPU: the one place that decides, with its reasons as data.

Inputs: the CPU's flags (`/proc/cpuinfo`, as Linux names them) and description (export/cpu.py),
per reduced-precision variant of a model whether the export dir has it and at which buckets it passed
its accuracy gate (the manifest, export/gate.py), and the latency export measured per variant and
bucket with the CPU it measured on (the manifest's `latency`, export/latency.py). Output: a `PrecisionChoice`: the precision of each bucket, and the
reasons, taken or not. `auto` decides per bucket: a variant that missed its gate at one bucket is
still served at the others (docs/DESIGN.md §4.5). `choose_precision` is a pure function, tested over
a table of CPUs and gates.

The flags that matter (what each reduced precision needs to be fast; without them the int8 and bf16
kernels exist but emulate, and are no faster than fp32 or slower):

    amx_bf16      Intel AMX tiles, bf16 matrix products (Sapphire Rapids and later)
    amx_int8      Intel AMX tiles, int8 matrix products
    avx512_vnni   int8 dot products in AVX-512 (Cascade Lake and later, AMD Zen 4 and later)
    avx_vnni      int8 dot products in AVX2 encoding (Alder Lake, Zen 5)
    avx512_bf16   bf16 dot products in AVX-512 (Cooper Lake, Zen 4): twice fp32's rate, not AMX's 16x
    avx2          u8·s8 products by pairs summed in int16 (vpmaddubsw): faster than fp32, exact only
                  with a 7-bit operand (7-bit weights, which export writes); the SSM convolutions'
                  u8·u8 products run widened to 16 bits, exact, and export writes them so where the
                  CPU has no VNNI (`int8_saturates`)

On the CPU the export timed the variants on (the same model name and flags), `auto` serves per
bucket the fastest of fp32 and the variants that passed there, by those figures: they are this
model's on this CPU, where a ranking measured on another CPU says little (int8's and bf16's gains depend on
the CPU's units). Memory counts too: fp32 and int8 run on ONNX Runtime over the one copy of the
model's weights, while the precisions on OpenVINO (export/precisions.py `ON_OPENVINO`) hold, per compiled bucket,
their products' weights repacked and memory of their own, about the same at every length. So OpenVINO serves at
most `openvino_buckets` buckets of a model (`OPENVINO_BUCKETS`), those where it saves the most milliseconds a
call, which grow with the length, and only where it measured `openvino_min_speedup` times faster than the ONNX
Runtime choice there (`OPENVINO_MIN_SPEEDUP`, beyond the record's noise): its gains are largest at the longest
buckets, where a second runtime's memory is worth paying for, and not worth it at every bucket of every model.
The settings `auto_openvino_buckets` and `auto_openvino_min_speedup` change both; a large count and 1 take the
fastest whatever its memory (the measurements behind these defaults: docs/BENCHMARKS.md). Elsewhere (another
CPU, or a dir without the figures) it goes by the flags: preference among the precisions a CPU runs fast and
whose variants passed, `preference`, read from the registry (`by_flags`, `preferred_with`): on a VNNI CPU without
AMX, ORT's int8 beats fp32 and OpenVINO's bf16 on AVX512_BF16 does not beat int8; on AMX both are fast, and bf16
through OpenVINO uses AMX-BF16 tiles for every product where int8 through ORT uses them only for the weight
products.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from export.cpu import (  # noqa: F401  (the CPU, read once)
    FLAG_NAMES,
    cpu_description,
    cpu_flags,
    cpu_model_name,
    has_exact_int8_products,
)
from export.manifest import LatencyRecord
from export.precisions import (
    AUTO,
    FP32,
    INT8,
    NAMES,
    ON_OPENVINO,
    PRECISIONS,
    REDUCED,
    PrecisionSetting,
    in_words,
    installed,
)
from export.precisions import PrecisionName as Precision

PRECISION_FLAGS = ("amx_bf16", "amx_int8", "avx512_vnni", "avx_vnni", "avx512_bf16")

# Which flags make a reduced precision fast, best first (any one suffices): the registry's `fast_with`
FAST_WITH: dict[Precision, tuple[str, ...]] = {name: PRECISIONS[name].fast_with for name in REDUCED}
FLAG_LABELS = {**FLAG_NAMES, "avx2": "AVX2"}  # the reasons' names of the flags (FLAG_NAMES: the CPU's identity)


# OpenVINO (`ON_OPENVINO`) is a second runtime: where fp32 and int8 share the model's one copy of the weights
# on ONNX Runtime, each bucket compiled by OpenVINO holds its products' weights repacked and memory of its own
# (tens of MB a bucket for a d = 256 model). So `auto` serves on it at most this many buckets of a model, those
# where it saves the most milliseconds a call by the latency record (module docstring)
OPENVINO_BUCKETS = 2
# ... and only where it measured this many times faster than the ONNX Runtime choice: beyond the record's noise (the
# same graphs timed by two exports differ by a few percent)
OPENVINO_MIN_SPEEDUP = 1.1


def int8_saturates(variant, flags: Iterable[str]) -> bool:
    """Whether an int8 variant's graphs (export/manifest.py `PrecisionVariant`) compute saturated products on a
    CPU with `flags`: where an operand has 8 bits (8-bit weights, or the SSM's 8-bit constants times signed
    inputs) and the CPU sums pairs of products in int16 (`has_exact_int8_products`)."""
    return variant.needs_int32_sums and not has_exact_int8_products(frozenset(flags))


def preference(flags: frozenset[str]) -> tuple[Precision, ...]:
    """Reduced precisions in the order `auto` tries them on a CPU with `flags` (fastest first): those the registry
    lets auto take by flags (`by_flags`), the ones this CPU has a `preferred_with` flag for first, else in the
    registry's order. Not a precision `auto` serves only where the export measured it fast enough on this CPU
    (int8-openvino, which must pay for OpenVINO's memory; `_auto_by_latency`): no flag says it does."""
    by_flags = [name for name in REDUCED if PRECISIONS[name].by_flags]
    return tuple(sorted(by_flags, key=lambda name: not flags & set(PRECISIONS[name].preferred_with)))


@dataclass(frozen=True)
class VariantStatus:
    """What an export dir says about one reduced-precision variant."""

    present: bool  # the dir has it (and this install can run it)
    passed: bool = False  # its accuracy gate passed at every bucket
    detail: str = ""  # e.g. the first failing measure, or why it cannot run
    # per bucket measured: its first failing measure, "" where the gate passed there (manifest `gate`)
    bucket_failures: dict[int, str] = field(default_factory=dict)

    def passed_at(self, bucket: int) -> bool:
        """Whether the variant may serve `bucket`: present, and its gate passed there."""
        return self.present and (self.passed or self.bucket_failures.get(bucket) == "")


# fp32 as a candidate of `auto`: the reference graphs, servable at every bucket
FP32_STATUS = VariantStatus(present=True, passed=True)

MIXED = "mixed"  # what `precision` says of a model served at more than one precision


def summary_precision(by_bucket: dict[int, str]) -> str:
    """The one precision every bucket is served at, or "mixed" (a model without buckets: fp32)."""
    served = set(by_bucket.values())
    return served.pop() if len(served) == 1 else (MIXED if served else FP32)


def dominant_precision(by_bucket: dict[int, str]) -> str:
    """The precision of the most buckets (a tie: the shortest bucket's), for a field that takes one
    precision (TEI's `model_dtype`)."""
    counts = Counter(p for _, p in sorted(by_bucket.items()))  # insertion order breaks ties
    return counts.most_common(1)[0][0] if counts else FP32


@dataclass(frozen=True)
class PrecisionChoice:
    by_bucket: dict[int, Precision]  # the precision each bucket is served at
    reasons: list[str] = field(default_factory=list)  # one per candidate (or group of buckets), in order

    @property
    def precision(self) -> str:
        """The one precision of every bucket, or "mixed" (only `auto` mixes)."""
        return summary_precision(self.by_bucket)

    def explain(self) -> str:
        setting = AUTO if self.precision == MIXED else self.precision
        return f"precision {setting}: " + "; ".join(self.reasons)


class PrecisionUnavailable(ValueError):
    """An explicit precision this export dir cannot serve (missing variant, or failed gate)."""


def choose_precision(
    setting: PrecisionSetting,
    flags: Iterable[str],
    variants: dict[Precision, VariantStatus],
    buckets: Iterable[int],
    latency: LatencyRecord | None = None,
    cpu: str = "",
    openvino_buckets: int = OPENVINO_BUCKETS,
    openvino_min_speedup: float = OPENVINO_MIN_SPEEDUP,
) -> PrecisionChoice:
    """The precision to serve at each of `buckets`.

    Explicit: that one at every bucket if the dir has it and its gate passed at every bucket (else
    `PrecisionUnavailable`), whatever the CPU: an explicit precision is a promise about the whole
    model, so a variant that failed at one bucket is refused rather than served in part.
    `auto`, where `latency` (the manifest's) was measured on a CPU described as `cpu` (this one,
    export/cpu.py `cpu_description`): per bucket, the fastest measured of fp32 and the variants the dir
    has whose gate passed at that bucket, bf16 and int8-openvino (OpenVINO) at no more than `openvino_buckets`
    buckets, where they save the most time and are `openvino_min_speedup` times faster than the fastest of the
    others (`_auto_by_latency`). Otherwise, per bucket, the first of
    `preference(flags)` that this CPU runs fast, that the dir has and whose gate passed at that bucket;
    fp32 at a bucket where none does."""
    flags, buckets = frozenset(flags), sorted(buckets)
    if setting == FP32:
        return PrecisionChoice(dict.fromkeys(buckets, FP32), ["fp32 asked for"])
    if setting in REDUCED:
        status = variants.get(setting, VariantStatus(present=False))
        if not status.present:
            raise PrecisionUnavailable(
                f"precision {setting} asked for, but the export dir has no {setting} variant"
                + (f" ({status.detail})" if status.detail else "")
                + f": export with `bigs export --precisions {setting}`, or serve precision auto or fp32"
            )
        if not status.passed:
            raise PrecisionUnavailable(
                f"precision {setting} asked for, but its variant failed its accuracy gate ({status.detail}): "
                "serve precision auto (which serves it at the buckets where its gate passed) or fp32"
            )
        fast = fast_flag(setting, flags)
        return PrecisionChoice(
            dict.fromkeys(buckets, setting),
            [f"{setting} asked for" + ("" if fast else " (this CPU has no flag that makes it fast)")],
        )
    if setting != AUTO:
        raise ValueError(f"unknown precision {setting!r}: {in_words((AUTO, *NAMES))}")

    figures, not_measured = latency_here(latency, cpu, variants, buckets)
    if figures is not None:
        return _auto_by_latency(flags, variants, buckets, figures, openvino_buckets, openvino_min_speedup)

    # No figures for this CPU: the order by its flags, which measurements on a few CPUs and models
    # set (module docstring). The candidates auto may use somewhere (fast here, present, passed at some bucket); the others get
    # one reason for the whole model.
    whole_model: dict[Precision, str] = {}
    usable: list[Precision] = []
    for precision in preference(flags):
        fast = fast_flag(precision, flags)
        status = variants.get(precision, VariantStatus(present=False))
        if fast is None:
            needs = " or ".join(FLAG_LABELS[f] for f in FAST_WITH[precision])
            whole_model[precision] = f"not {precision}: this CPU lacks {needs}"
        elif not status.present:
            whole_model[precision] = f"not {precision}: no {precision} variant" + (
                f" ({status.detail})" if status.detail else ""
            )
        elif not any(status.passed_at(b) for b in buckets):
            whole_model[precision] = f"not {precision}: failed its accuracy gate ({status.detail})"
        else:
            usable.append(precision)
    by_bucket: dict[int, Precision] = {b: next((p for p in usable if variants[p].passed_at(b)), FP32) for b in buckets}

    if len(set(by_bucket.values())) <= 1:  # one precision everywhere: the reasons in preference order
        served = summary_precision(by_bucket)
        reasons = []
        for precision in preference(flags):
            if precision in whole_model:
                reasons.append(whole_model[precision])
            elif precision == served:
                fast = FLAG_LABELS[fast_flag(precision, flags)]
                reasons.append(
                    f"{precision}: preferred for CPUs with {fast} ({not_measured}), "
                    "and the variant passed its accuracy gate"
                )
                return PrecisionChoice(by_bucket, reasons)
        reasons.append("fp32: no faster variant applies")
        return PrecisionChoice(by_bucket, reasons)

    # Mixed: per precision served, its buckets and why the candidates before it were not taken there.
    reasons = []
    for precision in (*preference(flags), FP32):
        if precision in whole_model:
            reasons.append(whole_model[precision])
        at = [b for b in buckets if by_bucket[b] == precision]
        if not at:
            continue
        why = []
        if precision != FP32:
            fast = FLAG_LABELS[fast_flag(precision, flags)]
            why.append(f"its gate passed there; preferred for CPUs with {fast}: {not_measured}")
        for earlier in usable[: usable.index(precision)] if precision in usable else usable:
            failed = [(b, variants[earlier].bucket_failures.get(b) or "not measured") for b in at]
            if len(failed) == 1:
                why.append(f"{earlier} failed its gate there: {failed[0][1]}")
            else:
                why.append(f"{earlier} failed its gate: " + ", ".join(f"at {b}: {f}" for b, f in failed))
        reasons.append(f"{precision} at {', '.join(map(str, at))} ({'; '.join(why)})")
    return PrecisionChoice(by_bucket, reasons)


def latency_here(
    latency: LatencyRecord | None, cpu: str, variants: dict[Precision, VariantStatus], buckets: list[int]
) -> tuple[dict[str, dict[int, float]] | None, str]:
    """The latency figures `auto` may rank by on this CPU, or None and, in words, why not.

    Only figures measured on a CPU of this description: int8's and bf16's gains over fp32 depend on
    the CPU's units, so another CPU's ranking says little here. And only a record with a figure for
    fp32 at every bucket and for each variant at every bucket where it passed its gate, so that no
    bucket is decided on part of the candidates."""
    if latency is None:
        return None, "no latency record for this CPU"
    if latency.measured_on != cpu:
        return None, f"latency was measured on another CPU, {latency.measured_on}"
    ms = latency.ms
    for precision in (FP32, *REDUCED):
        status = variants.get(precision, FP32_STATUS if precision == FP32 else VariantStatus(False))
        missing = [b for b in buckets if status.passed_at(b) and b not in ms.get(precision, {})]
        if missing:
            return None, f"the latency record has no {precision} figure at {', '.join(map(str, missing))}"
    return ms, ""


def _auto_by_latency(
    flags: frozenset[str],
    variants: dict[Precision, VariantStatus],
    buckets: list[int],
    ms: dict[str, dict[int, float]],
    openvino_buckets: int = OPENVINO_BUCKETS,
    openvino_min_speedup: float = OPENVINO_MIN_SPEEDUP,
) -> PrecisionChoice:
    """`auto` on the CPU the export timed: per bucket, the fastest of fp32 and the variants whose gate
    passed there, by the recorded figures, except that a precision on OpenVINO (bf16, int8-openvino: a second
    runtime, with memory of its own per bucket) is served at `openvino_buckets` buckets at most, those where it
    saves the most milliseconds a call, and only where it is `openvino_min_speedup` times the fastest on ONNX
    Runtime there.
    The CPU's flags only break a tie (`preference`); a variant this CPU "lacks the flags for" is still served
    where it measured fastest here. int8-openvino is a candidate where the dir has it (export writes it on CPUs
    with VNNI or AMX-INT8)."""
    whole_model: list[str] = []
    usable: list[Precision] = []
    extra = [p for p in REDUCED if p not in preference(flags) and variants.get(p, VariantStatus(False)).present]
    for precision in (*preference(flags), *extra):
        status = variants.get(precision, VariantStatus(present=False))
        if not status.present:
            whole_model.append(
                f"not {precision}: no {precision} variant" + (f" ({status.detail})" if status.detail else "")
            )
        elif not any(status.passed_at(b) for b in buckets):
            whole_model.append(f"not {precision}: failed its accuracy gate ({status.detail})")
        else:
            usable.append(precision)

    def candidates(bucket: int) -> list[str]:  # in tie-breaking order: the flags' preference, then fp32
        return [p for p in usable if variants[p].passed_at(bucket)] + [FP32]

    def fastest_on_one_copy(bucket: int) -> Precision:  # ONNX Runtime's: fp32 or int8, over the one weights copy
        return min((p for p in candidates(bucket) if p not in ON_OPENVINO), key=lambda p: ms[p][bucket])

    def fastest_on_openvino(bucket: int) -> Precision | None:  # bf16 or int8-openvino, where one passed there
        return min((p for p in candidates(bucket) if p in ON_OPENVINO), key=lambda p: ms[p][bucket], default=None)

    def saving(bucket: int) -> float | None:  # ms a call OpenVINO saves there, where it is fast enough to count
        fastest, one_copy = fastest_on_openvino(bucket), ms[fastest_on_one_copy(bucket)][bucket]
        if fastest is None or ms[fastest][bucket] * openvino_min_speedup >= one_copy:
            return None
        return one_copy - ms[fastest][bucket]

    saves = {b: saved for b in buckets if (saved := saving(b)) is not None}
    on_openvino = {b: fastest_on_openvino(b) for b in sorted(saves, key=lambda b: -saves[b])[:openvino_buckets]}
    by_bucket: dict[int, Precision] = {b: on_openvino.get(b) or fastest_on_one_copy(b) for b in buckets}
    the_buckets = "the one bucket" if openvino_buckets == 1 else f"the {openvino_buckets} buckets"
    openvino_rule = (
        f"{the_buckets} where it saves the most time a call (auto_openvino_buckets), "
        f"{openvino_min_speedup:g}x faster or more (auto_openvino_min_speedup)"
        if openvino_buckets
        else "no bucket (auto_openvino_buckets 0)"
    )

    reasons = list(whole_model)
    for precision in (*usable, FP32):
        at = [b for b in buckets if by_bucket[b] == precision]
        if not at:
            continue
        said = []
        for b in at:
            others = ", ".join(f"{p} {ms[p][b]:.3g} ms" for p in candidates(b) if p != precision)
            figure = f"{ms[precision][b]:.3g} ms" + (f" vs {others}" if others else "")
            said.append(figure if len(at) == 1 else f"at {b}: {figure}")
        figures = "; ".join(said)
        contested = any(len(candidates(b)) > 1 for b in at)  # else fp32 alone: nothing was faster to take
        why = [f"fastest measured on this CPU ({figures})"] if contested else []
        if precision in ON_OPENVINO:
            why = [f"fastest measured on this CPU, at {openvino_rule} ({figures})"]
        else:
            passed_over = {  # OpenVINO measured faster here, but is not among the buckets it is taken at
                b: faster for b in at if (faster := fastest_on_openvino(b)) and ms[faster][b] < ms[precision][b]
            }
            if passed_over:
                gains = ", ".join(f"{ms[precision][b] / ms[p][b]:.2f}x at {b}" for b, p in passed_over.items())
                names = " or ".join(sorted(set(passed_over.values())))
                why = [f"the fastest on the model's one copy of the weights ({figures})",
                       f"{names} faster by {gains}, but OpenVINO, with memory of its own per bucket, is taken at "
                       f"{openvino_rule}"]  # fmt: skip
        for other in usable:  # a variant left out at these buckets by its gate, not by its speed
            failed = [(b, variants[other].bucket_failures.get(b) or "not measured") for b in at
                      if not variants[other].passed_at(b)]  # fmt: skip
            if failed:
                why.append(f"{other} failed its gate " + ", ".join(f"at {b}: {f}" for b, f in failed))
        reasons.append(f"{precision} at {', '.join(map(str, at))}: {'; '.join(why) or 'no faster variant applies'}")
    return PrecisionChoice(by_bucket, reasons)


def fast_flag(precision: Precision, flags: frozenset[str]) -> str | None:
    """The first flag that makes `precision` fast on this CPU, or None."""
    return next((f for f in FAST_WITH.get(precision, ()) if f in flags), None)


def variant_statuses(
    manifest, flags: Iterable[str] | None = None, cpu: str | None = None
) -> dict[Precision, VariantStatus]:
    """What an export dir's manifest (export/manifest.py) offers per reduced precision, for this install
    and this CPU (`flags`, `cpu`: this machine's by default): a precision on OpenVINO needs it installed; int8
    graphs with 8-bit operands (weights written before export used 7-bit ones; the SSM convolutions with signed
    inputs, which export writes only on a CPU that sums in int32) on a CPU whose int8 products saturate
    (`int8_saturates`) compute something their gate did not measure, unless it was measured on this CPU."""
    flags = cpu_flags() if flags is None else frozenset(flags)
    cpu = cpu_description() if cpu is None else cpu
    statuses: dict[Precision, VariantStatus] = {}
    for precision in REDUCED:
        variant = manifest.precisions.get(precision)
        if variant is None and precision in manifest.refused:
            detail = f"the model dir refuses it: {manifest.refused[precision].why()}"
            statuses[precision] = VariantStatus(present=False, detail=detail)
        elif variant is None:
            detail = "export with --precisions int8" if precision == INT8 else ""
            if precision == INT8 and manifest.onnx and any(g.int8 for g in manifest.onnx.buckets.values()):
                detail = "int8 graphs without an accuracy gate: export again with --precisions int8"
            statuses[precision] = VariantStatus(present=False, detail=detail)
        elif variant.runtime == "openvino" and not installed("openvino"):
            statuses[precision] = VariantStatus(present=False, detail="OpenVINO is not installed: pip install openvino")
        elif precision == INT8 and int8_saturates(variant, flags) and variant.measured_on != cpu:
            detail = (f"its {variant.eight_bit_operands} saturate int8 products on this CPU (no VNNI or "
                      f"AMX-INT8), and its gate was measured on {variant.measured_on}: export again here "
                      "(7-bit weights, unsigned SSM inputs)")  # fmt: skip
            statuses[precision] = VariantStatus(
                present=True, passed=False, detail=detail, bucket_failures=dict.fromkeys(variant.gate, detail)
            )
        else:
            failures = variant.failures()
            statuses[precision] = VariantStatus(
                present=True,
                passed=bool(variant.passed),
                detail=failures[0] if failures else "",
                bucket_failures={b: (m.failures[0] if m.failures else "") for b, m in variant.gate.items()},
            )
    return statuses


def precision_for_model(
    setting: PrecisionSetting,
    runtime: str,
    manifest,
    openvino_buckets: int = OPENVINO_BUCKETS,
    openvino_min_speedup: float = OPENVINO_MIN_SPEEDUP,
) -> PrecisionChoice:
    """The precision each bucket of one served model runs at: reduced precision is a variant of the
    ONNX graphs, so other runtimes serve fp32 (an explicit int8/bf16 with them is an error)."""
    if runtime != "onnx":
        if setting in REDUCED:
            raise PrecisionUnavailable(f"precision {setting} needs runtime onnx (runtime {runtime} serves fp32)")
        buckets = manifest.buckets if manifest is not None else []
        return PrecisionChoice(dict.fromkeys(buckets, FP32), [f"runtime {runtime} serves fp32"])
    flags, cpu = cpu_flags(), cpu_description()
    return choose_precision(
        setting,
        flags,
        variant_statuses(manifest, flags, cpu),
        manifest.buckets,
        manifest.latency,
        cpu,
        openvino_buckets,
        openvino_min_speedup,
    )
