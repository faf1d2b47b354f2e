"""Which precision to serve on this CPU: the one place that decides, with its reasons as data.

Inputs: the CPU's flags (`/proc/cpuinfo`, as Linux names them) and, per reduced-precision variant
of a model, whether the export dir has it and whether it passed its accuracy gate (the manifest,
export/parity.py). Output: a `PrecisionChoice`: the precision, and one reason per candidate, taken
or not. `choose_precision` is a pure function, tested over a table of CPUs and gates.

The flags that matter (what each reduced precision needs to be fast; without them the int8 and bf16
kernels exist but emulate, and are no faster than fp32 or slower):

    amx_bf16      Intel AMX tiles, bf16 matrix products (Sapphire Rapids and later)
    amx_int8      Intel AMX tiles, int8 matrix products
    avx512_vnni   int8 dot products in AVX-512 (Cascade Lake and later, AMD Zen 4 and later)
    avx_vnni      int8 dot products in AVX2 encoding (Alder Lake, Zen 5)
    avx512_bf16   bf16 dot products in AVX-512 (Cooper Lake, Zen 4): twice fp32's rate, not AMX's 16x

Preference among the precisions a CPU runs fast and whose variants passed: `PREFERENCE`, from
measurements of the served variants (docs/DESIGN.md §4.5): on a VNNI CPU without AMX, ORT int8
beats fp32 at every bucket and OpenVINO bf16 on AVX512_BF16 does not beat int8; on AMX both are
fast and bf16 through OpenVINO uses AMX-BF16 tiles for every product, int8 through ORT only for
the weight products.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from export.cpu import FLAG_NAMES, cpu_flags, cpu_model_name  # noqa: F401  (the CPU, read in one place)

Precision = Literal["fp32", "int8", "bf16"]
PrecisionSetting = Literal["auto", "fp32", "int8", "bf16"]
REDUCED: tuple[Precision, ...] = ("int8", "bf16")
PRECISION_FLAGS = ("amx_bf16", "amx_int8", "avx512_vnni", "avx_vnni", "avx512_bf16")

# Which flags make a reduced precision fast, best first (any one suffices).
FAST_WITH: dict[Precision, tuple[str, ...]] = {
    "int8": ("amx_int8", "avx512_vnni", "avx_vnni"),
    "bf16": ("amx_bf16",),
}


def preference(flags: frozenset[str]) -> tuple[Precision, ...]:
    """Reduced precisions in the order `auto` tries them on a CPU with `flags` (fastest first)."""
    if "amx_bf16" in flags:
        return ("bf16", "int8")
    return ("int8", "bf16")


@dataclass(frozen=True)
class VariantStatus:
    """What an export dir says about one reduced-precision variant."""

    present: bool  # the dir has it (and this install can run it)
    passed: bool = False  # its accuracy gate passed at every bucket
    detail: str = ""  # e.g. the first failing measure, or why it cannot run


@dataclass(frozen=True)
class PrecisionChoice:
    precision: Precision
    reasons: list[str] = field(default_factory=list)  # one per candidate considered, in order

    def explain(self) -> str:
        return f"precision {self.precision}: " + "; ".join(self.reasons)


class PrecisionUnavailable(ValueError):
    """An explicit precision this export dir cannot serve (missing variant, or failed gate)."""


def choose_precision(
    setting: PrecisionSetting, flags: Iterable[str], variants: dict[Precision, VariantStatus]
) -> PrecisionChoice:
    """The precision to serve. Explicit: that one if the dir has it and it passed its gate (else
    `PrecisionUnavailable`), whatever the CPU. `auto`: the first of `preference(flags)` that this CPU
    runs fast, that the dir has and that passed; fp32 when none does."""
    flags = frozenset(flags)
    if setting == "fp32":
        return PrecisionChoice("fp32", ["fp32 asked for"])
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
                "serve precision auto or fp32"
            )
        fast = fast_flag(setting, flags)
        return PrecisionChoice(
            setting, [f"{setting} asked for" + ("" if fast else " (this CPU has no flag that makes it fast)")]
        )
    if setting != "auto":
        raise ValueError(f"unknown precision {setting!r}: auto, fp32, int8 or bf16")
    reasons = []
    for precision in preference(flags):
        fast = fast_flag(precision, flags)
        status = variants.get(precision, VariantStatus(present=False))
        if fast is None:
            needs = " or ".join(FLAG_NAMES[f] for f in FAST_WITH[precision])
            reasons.append(f"not {precision}: this CPU lacks {needs}")
        elif not status.present:
            reasons.append(
                f"not {precision}: no {precision} variant" + (f" ({status.detail})" if status.detail else "")
            )
        elif not status.passed:
            reasons.append(f"not {precision}: failed its accuracy gate ({status.detail})")
        else:
            reasons.append(f"{precision}: this CPU has {FLAG_NAMES[fast]} and the variant passed its accuracy gate")
            return PrecisionChoice(precision, reasons)
    reasons.append("fp32: no faster variant applies")
    return PrecisionChoice("fp32", reasons)


def fast_flag(precision: Precision, flags: frozenset[str]) -> str | None:
    """The first flag that makes `precision` fast on this CPU, or None."""
    return next((f for f in FAST_WITH.get(precision, ()) if f in flags), None)


def variant_statuses(manifest) -> dict[Precision, VariantStatus]:
    """What an export dir's manifest (export/manifest.py) offers per reduced precision, for this
    install: bf16 needs OpenVINO importable."""
    statuses: dict[Precision, VariantStatus] = {}
    for precision in REDUCED:
        variant = manifest.precisions.get(precision)
        if variant is None:
            detail = "export with --precisions int8" if precision == "int8" else ""
            if precision == "int8" and manifest.onnx and any(g.int8 for g in manifest.onnx.buckets.values()):
                detail = "int8 graphs without an accuracy gate: export again with --precisions int8"
            statuses[precision] = VariantStatus(present=False, detail=detail)
        elif variant.runtime == "openvino" and not _openvino_installed():
            statuses[precision] = VariantStatus(present=False, detail="OpenVINO is not installed: pip install openvino")
        else:
            failures = variant.failures()
            statuses[precision] = VariantStatus(
                present=True, passed=bool(variant.passed), detail=failures[0] if failures else ""
            )
    return statuses


def _openvino_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


def precision_for_model(setting: PrecisionSetting, runtime: str, manifest) -> PrecisionChoice:
    """The precision one served model runs at: reduced precision is a variant of the ONNX graphs, so
    other runtimes serve fp32 (an explicit int8/bf16 with them is an error)."""
    if runtime != "onnx":
        if setting in REDUCED:
            raise PrecisionUnavailable(f"precision {setting} needs runtime onnx (runtime {runtime} serves fp32)")
        return PrecisionChoice("fp32", [f"runtime {runtime} serves fp32"])
    return choose_precision(setting, cpu_flags(), variant_statuses(manifest))
