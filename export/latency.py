"""The latency export records: how long one request takes at each bucket, per way of serving the dir.

Which of fp32, int8 and bf16 is fastest depends on the CPU and on the model: the rule of thumb by
CPU flags (service/cpu_features.py `preference`) was measured on a few models and CPUs, and a
d=256 model gains less from int8 than a d=768 one (docs/DESIGN.md §4.5). So when export writes
reduced-precision variants it also times each of them and the fp32 graphs on the CPU it runs on,
with the runners the accuracy gate has just used (export/gate.py `measure_variants`), and records
the figures with that CPU's identity (export/cpu.py `cpu_description`) in the manifest's `latency`.
`auto` ranks the variants that passed their gate by these figures when it starts on a CPU of the
same description, and falls back to the order by flags elsewhere.

What is timed: batch 1, one sequence of the gate's real text filling the bucket (a fill-mask model
asked for one mask position, as a typical request), the median of `REPEATS` runs after one warm-up,
the candidates interleaved within each repeat so that they all see the same background load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from .cpu import cpu_description
from .heads import MASK_POSITIONS
from .manifest import LatencyRecord

REPEATS = 5
HOW = (
    f"batch 1, one sequence of the gate's text filling the bucket (fill-mask: one mask position), median of "
    f"{REPEATS} runs after one warm-up, the ways of serving interleaved; the runtimes' default threads"
)

Feeds = dict[str, np.ndarray]


def median_ms(runs: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, float]:
    """The median milliseconds of each of `runs` over `repeats` calls after one warm-up call each,
    interleaved within every repeat (a slow moment of the machine then costs them all alike)."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(1000 * (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in times.items()}


def one_request(batch: Feeds) -> Feeds:
    """The first sequence of a gate batch (export/gate.py `gate_batches`), as batch 1; a fill-mask
    model's mask positions cut to the first, since the gate masks every 7th token and a request
    usually masks one (the head's output, and its time, grows with the positions asked for)."""
    feeds = {name: value[:1] for name, value in batch.items() if not name.startswith("_")}
    if MASK_POSITIONS in feeds:
        feeds[MASK_POSITIONS] = feeds[MASK_POSITIONS][:, :1]
    return feeds


def measure_latency(
    runners: dict[str, Callable[[int, Feeds], object]], feeds: dict[int, Feeds], repeats: int = REPEATS
) -> LatencyRecord:
    """`runners` ("fp32", "int8", "bf16" → run(bucket, feeds)) timed at each bucket of `feeds`."""
    ms: dict[str, dict[int, float]] = {name: {} for name in runners}
    for bucket, bucket_feeds in sorted(feeds.items()):
        calls = {name: (lambda run=run, b=bucket, f=bucket_feeds: run(b, f)) for name, run in runners.items()}
        for name, value in median_ms(calls, repeats).items():
            ms[name][bucket] = round(value, 3)
    return LatencyRecord(measured_on=cpu_description(), how=HOW, ms=ms)
