"""The input feed: each step's batch built on the host and copied to the devices ahead of its step.

Why: an accelerator step on a small model takes milliseconds, about what masking and gathering a
batch on the host takes; built in line, the device would wait for the host every step. One worker
thread builds batch s+1 … s+depth (numpy releases the GIL for most of that work, and the copy to
the device runs while the current step computes) while the loop dispatches step s.

Nothing about the batches changes: the batch for step s is a pure function of (seed, s) (see
training/data), so a run with a feed `depth` steps ahead equals one built in line (depth 0, no
thread), which tests/test_training_steps.py checks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HostBatch = dict


def feed(
    steps: range,
    build: Callable[[int], HostBatch],
    to_device: Callable[[HostBatch], Any],
    depth: int,
) -> Iterator[tuple[int, HostBatch, Any, float]]:
    """Yield (step, host batch, device batch, seconds the loop waited for it) for each step in order."""

    def prepare(step: int):
        host = build(step)
        return host, to_device(host)

    if depth <= 0:
        for step in steps:
            started = time.perf_counter()
            host, device = prepare(step)
            yield step, host, device, time.perf_counter() - started
        return

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="input-feed") as pool:
        pending: deque = deque()
        upcoming = iter(steps)
        try:
            for step in upcoming:
                pending.append((step, pool.submit(prepare, step)))
                if len(pending) > depth:
                    break
            while pending:
                step, future = pending.popleft()
                started = time.perf_counter()
                host, device = future.result()  # re-raises what the worker raised
                waited = time.perf_counter() - started
                nxt = next(upcoming, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(prepare, nxt)))
                yield step, host, device, waited
        finally:  # the loop stopped early (an error, an interrupt): drop what was not started
            for _, future in pending:
                future.cancel()
