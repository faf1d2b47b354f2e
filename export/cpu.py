"""What this CPU is, read once from `/proc/cpuinfo`: its model name and its feature flags.

The one reader of the CPU for the whole project: the accuracy gate records the CPU a variant was
measured on (export/gate.py), the service decides which precision to serve from the flags
(service/cpu_features.py), and the benchmarks name the machine beside their figures. Standard
library only, so the serving image can import it.
"""

from __future__ import annotations

import functools
import platform
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


def cpu_model_name(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    return _field("model name", cpuinfo)


def cpu_description() -> str:
    """The model name and the reduced-precision flags this CPU has, e.g. "AMD EPYC (AVX512-VNNI, AVX512-BF16)"."""
    name = cpu_model_name() or platform.processor() or platform.machine() or "unknown CPU"
    flags = [label for flag, label in FLAG_NAMES.items() if flag in cpu_flags()]
    return f"{name} ({', '.join(flags) or 'no VNNI, BF16 or AMX'})"
