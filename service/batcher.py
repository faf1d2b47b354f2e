"""Dynamic batching per model and bucket, with long buckets on a lane of their own.

Each (head, bucket) has a FIFO queue. A lane is one worker thread plus the coroutine that feeds
it; the short lane serves buckets below `long_bucket_min_length`, the long lane the rest, so a
4,096-token batch that takes seconds never holds short requests back. A batch holds at most
max_batch_tokens positions (bucket × inputs), or one input of a longer bucket: at the default budget a
16,384-token document (an export with tiled positions) runs alone, as many positions as four of 4,096, so
the long lane's longest batch is no longer than it was.

A lane takes the queue whose oldest input has waited longest. While more requests for this model
are on their way (admitted and being tokenized), it waits for them until that queue can fill a
batch (token budget bucket × batch ≤ max_batch_tokens, and max_batch_size) or until max_wait_ms
have passed since that oldest input arrived, whichever is first; with nothing on its way it runs
at once, so a lone request never waits for company that is not coming. It takes the largest
power of two of the inputs ready — batch shapes stay within a small set, each (task, bucket) warmed
up at batch 1 at least (`warmup_batches`; the long lane's buckets by default on that lane right after
the service is ready, ahead of its first batch: `warmup_long_lane`) — and
runs them in its worker thread (ONNX Runtime and XLA release the GIL). Inputs whose client has
gone or whose deadline has passed are dropped before they cost anything.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from export.heads import MASK_POSITIONS, placeholder_inputs, signature

from .buckets import batch_sizes, pad_positions, pad_to_bucket
from .metrics import ServiceMetrics
from .runtimes import Runtime, release_memory
from .settings import ServiceSettings
from .tokenization import Encoded

# The long lanes' warm-ups after ready, one model at a time as before ready: run together, every model's longest
# activations were held at once and the process kept ~100 MB more resident after (five defaults, 2-core Xeon).
ONE_LONG_WARM_UP = threading.Lock()


def lane_name(bucket: int, settings: ServiceSettings) -> str:
    """The lane that serves `bucket`: "long" from `long_bucket_min_length` up, else "short"."""
    return "long" if bucket >= settings.long_bucket_min_length else "short"


class DeadlineExceeded(Exception):
    pass


class RuntimeFailure(Exception):
    pass


@dataclass
class Job:
    """One input on its way through the queue, carrying its own future and timings."""

    head: str
    bucket: int
    encoded: Encoded
    future: asyncio.Future
    deadline: float
    mask_positions: np.ndarray | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0
    inference_s: float = 0.0
    compute_tokens: int = 0
    batch_size: int = 0  # inputs in the batch it ran in (0: not run)

    @property
    def abandoned(self) -> bool:
        return self.future.done()  # cancelled by its request (client gone, deadline) or already failed


@dataclass
class Lane:
    name: str
    executor: ThreadPoolExecutor
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    running: list[Job] = field(default_factory=list)  # the batch on the runtime now


class ModelBatcher:
    def __init__(self, model_name: str, runtime: Runtime, settings: ServiceSettings, metrics: ServiceMetrics):
        self.model_name = model_name
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self._queue_time = metrics.queue_time.labels(model_name)
        self._inference_time = metrics.inference_time.labels(model_name)
        self.queues: dict[tuple[str, int], deque[Job]] = {}
        self.lanes = {
            name: Lane(name, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{model_name}-{name}"))
            for name in ("short", "long")
        }
        self.stopping = False
        self.closed: Callable[[], Exception] | None = None  # set by fail_all: what later submits raise
        self.arriving = 0  # requests admitted for this model whose inputs are not queued yet

    # -- shapes ---------------------------------------------------------------------------

    def lane_for(self, bucket: int) -> Lane:
        return self.lanes[lane_name(bucket, self.settings)]

    def short_lane_running(self) -> bool:
        """A batch is on the short lane's runtime now: what is queued meanwhile waits for it to end and forms the
        next batch together, so a short request need not be announced as on its way (`expecting`)."""
        return bool(self.lanes["short"].running)

    def batch_sizes(self, bucket: int) -> list[int]:
        return batch_sizes(bucket, self.settings.max_batch_tokens, self.settings.max_batch_size)

    def emitted_shapes(self, runtime: Runtime | None = None) -> list[tuple[str, int, int]]:
        """Every (head, bucket, batch) this batcher can emit (on `runtime`, default its own)."""
        runtime = runtime or self.runtime
        return [(h, b, n) for h in runtime.heads for b in runtime.buckets for n in self.batch_sizes(b)]

    def shapes(self, runtime: Runtime | None = None) -> list[tuple[str, int, int]]:
        """The emitted shapes warm-up must cover: of a runtime whose heads share one graph a bucket, the first
        head's stand for the others'."""
        runtime = runtime or self.runtime
        first = runtime.heads[0]
        return [s for s in self.emitted_shapes(runtime) if s[0] == first or not runtime.heads_share_a_graph]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for lane in self.lanes.values():
            lane.task = asyncio.get_running_loop().create_task(self._serve(lane), name=f"lane-{lane.name}")

    async def stop(self) -> None:
        """Drain: finish every queued input, then end the lanes."""
        self.stopping = True
        for lane in self.lanes.values():
            lane.wakeup.set()
        await asyncio.gather(*(lane.task for lane in self.lanes.values() if lane.task))
        for lane in self.lanes.values():
            lane.executor.shutdown(wait=True)

    def fail_all(self, error: Callable[[], Exception]) -> int:
        """Fail every queued input and those of the batches running now with `error()`, and every later
        submit (the drain on shutdown ran out of time). A running batch finishes on its worker thread;
        its answers are dropped. The number of inputs failed."""
        self.closed = error
        failed = 0
        for queue in self.queues.values():
            while queue:
                job = queue.popleft()
                self.metrics.queue_depth.labels(self.model_name, str(job.bucket)).dec()
                if not job.future.done():
                    job.future.set_exception(error())
                    failed += 1
        for lane in self.lanes.values():
            for job in lane.running:
                if not job.future.done():
                    job.future.set_exception(error())
                    failed += 1
        return failed

    def warm_shapes(
        self, runtime: Runtime | None = None, lanes: tuple[str, ...] | None = None
    ) -> list[tuple[str, int, int]]:
        """The shapes warm-up runs on `runtime` (default its own), of the buckets of `lanes` (default both): all
        of them, or batch 1 of each (head, bucket) (`warmup_batches`; auto: all where the runtime compiles per
        shape, i.e. XLA)."""
        runtime = runtime or self.runtime
        shapes = [s for s in self.shapes(runtime) if lanes is None or self.lane_for(s[1]).name in lanes]
        policy = self.settings.warmup_batches
        if policy == "auto":
            policy = "all" if runtime.kind == "stablehlo" else "first"
        return shapes if policy == "all" else [s for s in shapes if s[2] == 1]

    def warm_up(
        self,
        done: Callable[[int, int], object] | None = None,
        runtime: Runtime | None = None,
        lanes: tuple[str, ...] | None = None,
    ) -> None:
        """Run every warm-up shape of `lanes`' buckets (default both) once (blocking; called before the service
        says ready, or before a model switches to `runtime`, default its own; the long lane's own on its thread,
        `warm_long_lane`), bucket by bucket, shortest first; `done(bucket, shapes)` after each (one start-up line
        per bucket, not per shape: a model has dozens of shapes)."""
        runtime = runtime or self.runtime
        shapes = self.warm_shapes(runtime, lanes)
        buckets = sorted({b for _, b, _ in shapes})
        for bucket in buckets:
            these = [(head, batch) for head, b, batch in shapes if b == bucket]
            for head, batch in these:
                runtime.run(head, bucket, placeholder_inputs(head, batch, bucket))
            if done is not None:
                done(bucket, len(these))
        # warm-up's buffers, where a runtime keeps them per model (OpenVINO's): all of them, or (one lane's
        # warm-up, while the other lane may be running) those of the buckets it warmed
        release_memory(runtime, None if lanes is None else buckets)

    def warm_long_lane(self, done: Callable[[float, list[int]], object]) -> Future | None:
        """After `start`: the long lane's warm-up (`warm_up` of its buckets) on the long lane's own worker, so it
        runs before any long batch the lane takes after it (one worker, first come first served). `done(seconds,
        buckets)` when it is over. None: the lane has nothing to warm."""
        buckets = sorted({b for _, b, _ in self.warm_shapes(lanes=("long",))})
        if not buckets:
            return None

        def warm() -> None:
            with ONE_LONG_WARM_UP:
                started = time.perf_counter()
                self.warm_up(lanes=("long",))
                done(time.perf_counter() - started, buckets)

        return self.lanes["long"].executor.submit(warm)

    # -- the queue ------------------------------------------------------------------------

    @contextmanager
    def expecting(self):
        """Around a request's tokenization: while it runs, lanes know more inputs are on their way."""
        self.arriving += 1
        try:
            yield
        finally:
            self.arriving -= 1
            for lane in self.lanes.values():  # a lane waiting for this request re-checks
                lane.wakeup.set()

    def submit(self, job: Job) -> None:
        if self.closed is not None:
            raise self.closed()
        if self.stopping:
            raise RuntimeError("the service is shutting down")
        self.queues.setdefault((job.head, job.bucket), deque()).append(job)
        self.metrics.queue_depth.labels(self.model_name, str(job.bucket)).inc()
        self.lane_for(job.bucket).wakeup.set()

    def _drop_abandoned(self, queue: deque[Job], now: float) -> None:
        while queue and (queue[0].abandoned or queue[0].deadline <= now):
            job = queue.popleft()
            self.metrics.queue_depth.labels(self.model_name, str(job.bucket)).dec()
            self.metrics.dropped.labels(self.model_name).inc()
            if not job.future.done():
                job.future.set_exception(DeadlineExceeded("the request deadline passed while it was queued"))

    def _oldest_queue(self, lane: Lane) -> tuple[str, int] | None:
        now = time.perf_counter()
        best, best_time = None, None
        for key, queue in self.queues.items():
            if self.lane_for(key[1]) is not lane:
                continue
            self._drop_abandoned(queue, now)
            if queue and (best_time is None or queue[0].enqueued < best_time):
                best, best_time = key, queue[0].enqueued
        return best

    async def _serve(self, lane: Lane) -> None:
        max_wait = self.settings.max_wait_ms / 1000
        while True:
            key = self._oldest_queue(lane)
            if key is None:
                if self.stopping:
                    return
                lane.wakeup.clear()
                await lane.wakeup.wait()
                continue
            queue = self.queues[key]
            cap = self.batch_sizes(key[1])[-1]
            # Waiting pays only for inputs that are coming: requests being tokenized now. Those that
            # arrive while a batch runs queue up and form the next one anyway.
            fill_by = queue[0].enqueued + max_wait
            while len(queue) < cap and self.arriving and not self.stopping:
                remaining = fill_by - time.perf_counter()
                if remaining <= 0:
                    break
                lane.wakeup.clear()
                try:
                    await asyncio.wait_for(lane.wakeup.wait(), remaining)
                except TimeoutError:
                    break
            jobs = self._take(queue, cap)
            if jobs:
                await self._run(lane, key, jobs)

    def _take(self, queue: deque[Job], cap: int) -> list[Job]:
        jobs: list[Job] = []
        while queue and len(jobs) < cap:
            self._drop_abandoned(queue, time.perf_counter())
            if not queue:
                break
            jobs.append(queue.popleft())
            self.metrics.queue_depth.labels(self.model_name, str(jobs[-1].bucket)).dec()
        size = 1 << (len(jobs).bit_length() - 1) if jobs else 0  # largest warmed-up shape ≤ ready inputs
        for job in reversed(jobs[size:]):  # the rest go back to the front, in order
            queue.appendleft(job)
            self.metrics.queue_depth.labels(self.model_name, str(job.bucket)).inc()
        return jobs[:size]

    async def _run(self, lane: Lane, key: tuple[str, int], jobs: list[Job]) -> None:
        head, bucket = key
        inputs = pad_to_bucket([job.encoded for job in jobs], bucket)
        if signature(head).takes_positions:
            width = max(len(job.mask_positions) for job in jobs)
            inputs[MASK_POSITIONS] = pad_positions([job.mask_positions for job in jobs], width)
        started = time.perf_counter()
        for job in jobs:
            job.queue_s = started - job.enqueued
        labels = (self.model_name, str(bucket))
        lane.running = jobs
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
                lane.executor, self.runtime.run, head, bucket, inputs
            )
            if len(outputs) != len(jobs):  # checked here: a bad answer must fail its batch, not end the lane
                raise ValueError(f"the runtime answered {len(outputs)} rows for a batch of {len(jobs)}")
        except Exception as error:  # a failed batch fails its own requests only
            self.metrics.runtime_errors.labels(*labels).inc()
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(RuntimeFailure(f"{type(error).__name__}: {error}"))
            return
        finally:
            lane.running = []
        elapsed = time.perf_counter() - started
        self.metrics.batch_size.labels(*labels).observe(len(jobs))
        self.metrics.bucket_latency.labels(*labels).observe(elapsed)
        self.metrics.tokens_computed.labels(*labels).inc(bucket * len(jobs))
        self.metrics.tokens_real.labels(*labels).inc(sum(job.encoded.length for job in jobs))
        queue_time, inference_time = self._queue_time, self._inference_time  # per input (a batch: bucket_latency)
        for row, job in enumerate(jobs):
            job.inference_s = elapsed
            job.compute_tokens = bucket
            job.batch_size = len(jobs)
            queue_time.observe(job.queue_s)
            inference_time.observe(elapsed)
            if not job.future.done():
                result = outputs[row]
                if job.mask_positions is not None:  # this job's positions only, not the batch's padding
                    result = result[: len(job.mask_positions)]
                job.future.set_result(result)
