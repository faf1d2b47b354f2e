"""The latency export records: how long one request takes at each bucket, per way of serving the dir.

Which of fp32, int8 and bf16 is fastest depends on the CPU and on the model: the rule of thumb by
CPU flags (service/precision_policy.py `preference`) was measured on a few models and CPUs, and a
d=256 model gains less from int8 than a d=768 one (docs/DESIGN.md §4.5). So when export writes
reduced-precision variants it also times each of them and the fp32 graphs on the CPU it runs on,
with the runners the accuracy gate has just used (export/gate.py `measure_variants`), and records
the figures with that CPU's identity (export/cpu.py `cpu_description`) in the manifest's `latency`.
`auto` ranks the variants that passed their gate by these figures when it starts on a CPU of the
same description, and falls back to the order by flags elsewhere.

What is timed: batch 1, one sequence of the gate's real text filling the bucket (a fill-mask model
asked for one mask position, as a typical request), the fastest of at least `REPEATS` runs after one
warm-up, the candidates interleaved within each repeat so that they all see the same background load.
A short bucket takes milliseconds a run, so it is run on until the candidates have had `MIN_SECONDS`
between them (at most `MAX_REPEATS` runs). Both because the record decides what `auto` serves, and a
shared host's neighbour only ever adds time: on a 2-core AVX512-VNNI EPYC two exports in a row took
the median of five runs at 128 tokens inside such a burst (bigs-mini-embed's int8 12.8 ms and fp32
18.1 against 5–7 and 11–13 in quiet runs beside them; then bigs-mini-longdoc's, with a second of runs),
ORT slowed more than OpenVINO, bf16 came out 1.55x and 1.66x int8's speed, and `auto` served it at 128,
with OpenVINO's memory and answers other than the card's. The fastest run is what the CPU does, which is
what the choice is about. The long buckets' time is what it was.
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
MIN_SECONDS = 1.0  # of runs per bucket, all candidates together, before the fastest is taken
MAX_REPEATS = 40
HOW = (
    f"batch 1, one sequence of the gate's text filling the bucket (fill-mask: one mask position), the fastest of "
    f"{REPEATS} to {MAX_REPEATS} runs (until {MIN_SECONDS:g} s of them) after one warm-up, the ways of serving "
    "interleaved; the runtimes' default threads"
)

Feeds = dict[str, np.ndarray]


def interleaved_ms(
    runs: dict[str, Callable[[], object]],
    repeats: int = REPEATS,
    min_seconds: float = 0.0,
    max_repeats: int = MAX_REPEATS,
) -> dict[str, list[float]]:
    """The milliseconds of each call of each of `runs` after one warm-up call each: `repeats` calls, and more
    until the calls have taken `min_seconds` in all (at most `max_repeats`), interleaved within every repeat
    (a slow moment of the machine then costs them all alike)."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    spent, done = 0.0, 0
    while done < repeats or (spent < min_seconds and done < max_repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            times[name].append(1000 * elapsed)
            spent += elapsed
        done += 1
    return times


def median_ms(runs: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, float]:
    """The median milliseconds of each of `runs` over `repeats` interleaved calls (`bigs bench precision`'s cells)."""
    return {name: statistics.median(values) for name, values in interleaved_ms(runs, repeats).items()}


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
    """`runners` ("fp32", "int8", "bf16" → run(bucket, feeds)) timed at each bucket of `feeds`: the fastest of each
    one's interleaved runs, at least `repeats`, more until `MIN_SECONDS` of them (module docstring)."""
    ms: dict[str, dict[int, float]] = {name: {} for name in runners}
    for bucket, bucket_feeds in sorted(feeds.items()):
        calls = {name: (lambda run=run, b=bucket, f=bucket_feeds: run(b, f)) for name, run in runners.items()}
        for name, values in interleaved_ms(calls, repeats, MIN_SECONDS).items():
            ms[name][bucket] = round(min(values), 3)
    return LatencyRecord(measured_on=cpu_description(), how=HOW, ms=ms)
