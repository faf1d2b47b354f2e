"""What this CPU is, read once from `/proc/cpuinfo`: its model name and its feature flags.

The one reader of the CPU for the whole project: the accuracy gate records the CPU a variant was
measured on and export the CPU its latencies were measured on (export/gate.py, export/latency.py;
`cpu_description` is that CPU's identity), the service decides which precision to serve from the flags
(service/precision_policy.py), and the benchmarks name the machine beside their figures
(`cpu_description`, or `machine_description` with the cores and every SIMD flag). Standard
library only, so the serving image can import it.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path

# The flags that decide how fast reduced precision runs, as Linux names them, and as people do.
FLAG_NAMES = {
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX512-BF16",
}


def _field(name: str, cpuinfo: str) -> str | None:
    """The first processor's `name` line of `cpuinfo`, or None where there is no such file or line."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first processor's `flags` line); empty where there is no cpuinfo."""
    return frozenset((_field("flags", cpuinfo) or "").split())


# The flags with which OpenVINO computes bf16 as bf16; on any other CPU it computes f32 whatever it is asked.
BF16_UNITS = ("amx_bf16", "avx512_bf16")


def has_bf16_units() -> bool:
    return any(flag in cpu_flags() for flag in BF16_UNITS)


# The flags with which int8 products are exact at 8 bits: uint8 × int8 pairs summed into int32 (VNNI's
# vpdpbusd, AMX tiles). Without them ORT sums each pair in int16 first (AVX2's vpmaddubsw), which saturates
# where two products of a uint8 value and an 8-bit int8 one exceed 32,767 (7-bit weights cannot).
EXACT_INT8_WITH = ("amx_int8", "avx512_vnni", "avx_vnni")


def has_exact_int8_products(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU (or one with `flags`) sums int8 products in int32, so that 8-bit operands cannot saturate."""
    return bool(set(EXACT_INT8_WITH) & (cpu_flags() if flags is None else flags))


def cpu_model_name(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    return _field("model name", cpuinfo)


def _name() -> str:
    return cpu_model_name() or platform.processor() or platform.machine() or "unknown CPU"


def cpu_description() -> str:
    """The model name and the reduced-precision flags this CPU has, e.g. "AMD EPYC (AVX512-VNNI, AVX512-BF16)"."""
    name = _name()
    flags = [label for flag, label in FLAG_NAMES.items() if flag in cpu_flags()]
    return f"{name} ({', '.join(flags) or 'no VNNI, BF16 or AMX'})"


# The SIMD flags that decide how fast dense kernels run (fp32, int8, bf16), for benchmark reports
SIMD_FLAGS = re.compile(r"(avx2|fma|avx512(f|bw|vl|_vnni|_bf16|_fp16)|avx_vnni|amx\w*)$")


def machine_description() -> str:
    """What a benchmark names beside its figures: the model name, the cores visible and the SIMD
    flags, e.g. "AMD EPYC, 2 cores visible, flags: avx2 avx512_bf16 … (no AMX)"."""
    flags = cpu_flags()
    simd = [f for f in sorted(flags) if SIMD_FLAGS.match(f)]
    no_amx = "" if any(f.startswith("amx") for f in flags) else " (no AMX)"
    return f"{_name()}, {os.cpu_count()} cores visible, flags: {' '.join(simd) or 'no AVX2/AVX-512/AMX'}{no_amx}"
