"""The batcher's scheduling policy with a fake runtime: no model, no export, no HTTP; and service/buckets.py.

`FakeRuntime` answers each input with a row that names it (its first token id), records every call,
and can hold a call until the test releases it, or fail it: tests order events themselves instead of
racing the clock. Where time is the claim (waiting for requests on their way) the margins are wide:
max_wait_ms is a second or two and an upper bound at most half of it; a slow machine cannot break a lower bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

for _needed in ("prometheus_client", "pydantic_settings"):  # the serve extra
    pytest.importorskip(_needed)

from service.batcher import DeadlineExceeded, Job, ModelBatcher, RuntimeFailure  # noqa: E402
from service.buckets import batch_sizes, bucket_for, pad_positions, pad_to_bucket  # noqa: E402
from service.metrics import ServiceMetrics  # noqa: E402
from service.settings import ServiceSettings  # noqa: E402
from service.tokenization import Encoded  # noqa: E402

MODEL = "fake"
BUCKETS = [16, 64, 256, 1024]
HOLD_S = 10.0  # the longest anything waits: a broken batcher fails a test instead of hanging it


# -- a runtime that records, holds and fails ---------------------------------------------------


@dataclass
class Call:
    head: str
    bucket: int
    ids: list[int]  # each row's first token id: which inputs ran together, in row order
    inputs: dict[str, np.ndarray]
    thread: str

    @property
    def size(self) -> int:
        return len(self.ids)


class FakeRuntime:
    """The Runtime protocol without a model. Output row i is [first token id of input i, bucket];
    for fill-mask it is (P, 2): [first token id, mask position] at each of the row's P positions."""

    kind = "fake"
    heads_share_a_graph = False  # a program per head, as StableHLO's: warm-up runs each

    def __init__(self, heads=("classification",), buckets=BUCKETS):
        self.heads, self.buckets = list(heads), list(buckets)
        self.calls: list[Call] = []
        self.held: dict[int, threading.Event] = {}  # input id -> its call may return
        self.entered: dict[int, threading.Event] = {}  # input id -> its call has started
        self.failing: set[int] = set()  # a call with any of these inputs raises
        self.short_of_rows: set[int] = set()  # a call with any of these inputs answers one row too few
        self.sleep_s = 0.0
        self._lock = threading.Lock()

    def hold(self, ident: int) -> None:
        self.held[ident], self.entered[ident] = threading.Event(), threading.Event()

    def release(self) -> None:
        for event in self.held.values():
            event.set()

    async def reached(self, ident: int) -> None:
        """Returns once the call holding input `ident` is inside the runtime."""
        assert await asyncio.to_thread(self.entered[ident].wait, HOLD_S), f"input {ident} never reached the runtime"

    def ran(self) -> list[int]:
        return [ident for call in self.calls for ident in call.ids]

    def run(self, head: str, bucket: int, inputs: dict[str, np.ndarray]) -> np.ndarray:
        ids = [int(i) for i in inputs["input_ids"][:, 0]]
        copied = {name: array.copy() for name, array in inputs.items()}
        with self._lock:
            self.calls.append(Call(head, bucket, ids, copied, threading.current_thread().name))
        for ident in ids:
            if ident in self.held:
                self.entered[ident].set()
                self.held[ident].wait(HOLD_S)
        if self.failing.intersection(ids):
            raise RuntimeError("injected: the device went away")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        rows = np.asarray(ids, np.float32)
        if head == "fill-mask":
            positions = inputs["mask_positions"].astype(np.float32)
            out = np.stack([np.broadcast_to(rows[:, None], positions.shape), positions], axis=-1)
        else:
            out = np.stack([rows, np.full_like(rows, bucket)], axis=1)
        return out[:-1] if self.short_of_rows.intersection(ids) else out


# -- helpers ---------------------------------------------------------------------------------

_idents = itertools.count(1)


def new_ids(n: int) -> list[int]:
    """Input ids unique across the file (0 is what warm-up sends)."""
    return [next(_idents) for _ in range(n)]


def settings(**overrides) -> ServiceSettings:
    values = dict(max_batch_tokens=4096, max_batch_size=8, max_wait_ms=2000.0, long_bucket_min_length=1024)
    return ServiceSettings(**{**values, **overrides})


def make_job(
    ident: int, length: int = 16, head: str = "classification", deadline_s: float = 60.0, mask_positions=None
) -> Job:
    """As ServedModel.submit builds one: the smallest bucket that holds the input, a future of the running loop."""
    return Job(
        head=head,
        bucket=bucket_for(length, BUCKETS),
        encoded=Encoded(np.full(length, ident, np.int64), np.zeros(length, np.int64)),
        future=asyncio.get_running_loop().create_future(),
        deadline=time.perf_counter() + deadline_s,
        mask_positions=None if mask_positions is None else np.asarray(mask_positions, np.int64),
    )


def submit(batcher: ModelBatcher, ident: int, **job) -> Job:
    queued = make_job(ident, **job)
    batcher.submit(queued)
    return queued


async def answers(jobs: list[Job], timeout: float = HOLD_S) -> list[np.ndarray]:
    return await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), timeout)


def assert_own_rows(jobs: list[Job], results: list[np.ndarray]) -> None:
    for job, result in zip(jobs, results, strict=True):
        assert result.tolist() == [job.encoded.input_ids[0], job.bucket]


@contextlib.asynccontextmanager
async def serving(runtime: FakeRuntime, metrics: ServiceMetrics | None = None, **overrides):
    """A started batcher over `runtime`; at exit every held call is released and the batcher stopped."""
    batcher = ModelBatcher(MODEL, runtime, settings(**overrides), metrics or ServiceMetrics())
    batcher.start()
    try:
        yield batcher
    finally:
        runtime.release()
        await asyncio.wait_for(batcher.stop(), HOLD_S)


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario, 3 * HOLD_S))


def sample(metrics: ServiceMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model": MODEL, **labels}) or 0.0


async def entered_expecting(batcher: ModelBatcher, leave: asyncio.Event) -> asyncio.Task:
    """A request on its way: inside `expecting()` until `leave` is set; returns once it is inside."""
    inside = asyncio.Event()

    async def on_its_way():
        with batcher.expecting():
            inside.set()
            await leave.wait()

    task = asyncio.create_task(on_its_way())
    await inside.wait()
    return task


# -- buckets.py ------------------------------------------------------------------------------


def test_an_input_goes_to_the_smallest_bucket_that_holds_it():
    assert [bucket_for(n, BUCKETS) for n in (1, 16, 17, 64, 65, 1000, 1024)] == [16, 16, 64, 64, 256, 1024, 1024]
    with pytest.raises(ValueError, match="1025 tokens"):
        bucket_for(1025, BUCKETS)


@pytest.mark.parametrize(
    "bucket, max_batch_tokens, max_batch_size, sizes",
    [
        (64, 4096, 32, [1, 2, 4, 8, 16, 32]),  # the batch size binds
        (64, 4096, 24, [1, 2, 4, 8, 16]),  # ... rounded down to a power of two
        (1024, 4096, 32, [1, 2, 4]),  # the token budget binds
        (256, 1000, 32, [1, 2]),  # 1000 // 256 = 3, rounded down
        (1024, 512, 32, [1]),  # a bucket over the budget still runs, alone
        (8192, 16384, 32, [1, 2]),  # the default budget at buckets past 4,096 (positions tiled)
        (16384, 16384, 32, [1]),  # a document of the longest tiled bucket fills a batch alone
        (32768, 16384, 32, [1]),  # ... and a longer one runs alone, over the budget
    ],
)
def test_batch_sizes_are_the_powers_of_two_within_the_token_budget(bucket, max_batch_tokens, max_batch_size, sizes):
    assert batch_sizes(bucket, max_batch_tokens, max_batch_size) == sizes


def test_inputs_are_right_padded_to_their_bucket():
    encoded = [Encoded(np.array([5, 6, 7]), np.array([0, 1, 1])), Encoded(np.array([8]), np.array([0]))]
    padded = pad_to_bucket(encoded, 4, pad_token_id=3)
    assert {name: (a.shape, a.dtype) for name, a in padded.items()} == {
        name: ((2, 4), np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    assert padded["input_ids"].tolist() == [[5, 6, 7, 3], [8, 3, 3, 3]]
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert padded["token_type_ids"].tolist() == [[0, 1, 1, 0], [0, 0, 0, 0]]


def test_short_mask_position_rows_repeat_their_first_position():
    positions = [np.array([3]), np.array([1, 4, 5]), np.array([2, 6])]
    padded = pad_positions(positions, 3)
    assert padded.dtype == np.int64
    assert padded.tolist() == [[3, 3, 3], [1, 4, 5], [2, 6, 2]]


# -- batches cut by the token budget ---------------------------------------------------------


@pytest.mark.parametrize(
    "bucket, max_batch_tokens, max_batch_size, largest",
    [(64, 4096, 32, 32), (64, 4096, 24, 16), (1024, 4096, 32, 4), (256, 1000, 32, 2), (1024, 512, 32, 1)],
)
def test_largest_batch_is_the_token_budget_rounded_down_to_a_power_of_two(
    bucket, max_batch_tokens, max_batch_size, largest
):
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size) as batcher:
            jobs = [submit(batcher, ident, length=bucket) for ident in new_ids(2 * largest + 3)]  # all queued at once
            await answers(jobs)
        assert batcher.batch_sizes(bucket)[-1] == largest
        assert runtime.calls[0].size == max(call.size for call in runtime.calls) == largest

    run(scenario())


def test_more_queued_inputs_than_the_largest_batch_run_as_several_batches_in_order():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_batch_tokens=8 * 64, max_batch_size=32) as batcher:  # bucket 64: 8
            ids = new_ids(15)
            jobs = [submit(batcher, ident, length=64) for ident in ids]
            assert_own_rows(jobs, await answers(jobs))
        assert [call.size for call in runtime.calls] == [8, 4, 2, 1]  # 7 ready: the largest power of two, and so on
        assert runtime.ran() == ids

    run(scenario())


def test_emitted_batches_are_powers_of_two_within_the_warmed_up_shapes():
    """A random load of requests, each on its way for a while, over two heads and every bucket."""

    async def scenario():
        rng = random.Random(0)
        runtime = FakeRuntime(heads=("classification", "embeddings"))
        runtime.sleep_s = 0.002  # queues build up while a batch runs
        lengths = [5, 16, 30, 64, 100, 256, 600, 1024]
        metrics = ServiceMetrics()
        async with serving(runtime, metrics, max_batch_tokens=1000, max_batch_size=6, max_wait_ms=20) as batcher:
            shapes = set(batcher.emitted_shapes())
            plans = [
                (rng.random() * 0.3, rng.random() * 0.01, rng.choice(runtime.heads), rng.randint(1, 6))
                for _ in range(60)
            ]

            async def request(start_s, tokenize_s, head, n):
                await asyncio.sleep(start_s)
                with batcher.expecting():
                    await asyncio.sleep(tokenize_s)
                return [submit(batcher, ident, head=head, length=rng.choice(lengths)) for ident in new_ids(n)]

            jobs = [job for request_jobs in await asyncio.gather(*(request(*p) for p in plans)) for job in request_jobs]
            assert_own_rows(jobs, await answers(jobs))
        assert sorted(runtime.ran()) == sorted(int(job.encoded.input_ids[0]) for job in jobs)  # each input once
        assert all(sample(metrics, "bigs_queue_depth", bucket=str(b)) == 0 for b in runtime.buckets)
        for call in runtime.calls:
            assert call.size & (call.size - 1) == 0, call.size
            assert (call.head, call.bucket, call.size) in shapes
        assert any(call.size > 1 for call in runtime.calls)  # the load did batch

    run(scenario())


# -- oldest first ----------------------------------------------------------------------------


def test_a_lane_serves_the_queue_whose_oldest_input_arrived_first():
    async def scenario():
        runtime = FakeRuntime(heads=("classification", "embeddings"))
        queues = {"a": ("classification", 16), "b": ("classification", 64), "c": ("embeddings", 16)}
        queues["d"] = ("embeddings", 256)  # all four on the short lane

        def submit_to(q: str, ident: int) -> Job:
            return submit(batcher, ident, head=queues[q][0], length=queues[q][1])

        async with serving(runtime) as batcher:
            # one input per queue first, in the order a, b, c, d: an order that age must override
            await answers([submit_to(q, ident) for q, ident in zip("abcd", new_ids(4), strict=True)])
            (blocker,) = new_ids(1)
            runtime.hold(blocker)
            jobs = [submit(batcher, blocker)]
            await runtime.reached(blocker)
            arrivals = "dbdcab"  # while the lane is busy; the oldest input of each queue: d, b, c, a
            jobs += [submit_to(q, ident) for q, ident in zip(arrivals, new_ids(6), strict=True)]
            runtime.release()
            await answers(jobs)
        after_blocker = runtime.calls[5:]
        assert [(call.head, call.bucket) for call in after_blocker] == [queues[q] for q in "dbca"]
        assert [call.size for call in after_blocker] == [2, 2, 1, 1]

    run(scenario())


def test_inputs_within_a_queue_run_first_in_first_out():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_batch_size=2) as batcher:
            (blocker,) = new_ids(1)
            runtime.hold(blocker)
            jobs = [submit(batcher, blocker)]
            await runtime.reached(blocker)
            ids = new_ids(7)
            jobs += [submit(batcher, ident) for ident in ids]
            runtime.release()
            await answers(jobs)
        assert [call.ids for call in runtime.calls[1:]] == [ids[0:2], ids[2:4], ids[4:6], ids[6:7]]

    run(scenario())


def test_with_one_input_per_batch_a_lane_runs_inputs_in_arrival_order_across_queues():
    async def scenario():
        runtime = FakeRuntime(heads=("classification", "embeddings"))
        rng = random.Random(1)
        async with serving(runtime, max_batch_size=1) as batcher:
            (blocker,) = new_ids(1)
            runtime.hold(blocker)
            jobs = [submit(batcher, blocker)]
            await runtime.reached(blocker)
            ids = new_ids(20)
            for ident in ids:
                jobs.append(submit(batcher, ident, head=rng.choice(runtime.heads), length=rng.choice([8, 40, 200])))
            runtime.release()
            await answers(jobs)
        assert runtime.ran() == [blocker, *ids]

    run(scenario())


# -- waiting only for requests on their way --------------------------------------------------


def test_a_lone_request_runs_at_once_without_waiting_for_max_wait():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=2000) as batcher:
            started = time.perf_counter()
            await answers([submit(batcher, *new_ids(1))])
            elapsed = time.perf_counter() - started
        assert elapsed < 1.0, elapsed  # nothing was on its way: no reason to wait 2 s
        assert [call.size for call in runtime.calls] == [1]

    run(scenario())


def test_a_request_on_its_way_is_waited_for_and_joins_the_batch():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=2000) as batcher:
            first, second = new_ids(2)
            leave = asyncio.Event()
            on_its_way = await entered_expecting(batcher, leave)
            jobs = [submit(batcher, first)]
            await asyncio.sleep(0.2)  # tokenizing; the lane must not have run the first input alone
            assert runtime.calls == []
            leave.set()
            await on_its_way  # out of expecting(); it submits with no await in between, as routes do
            jobs.append(submit(batcher, second))
            await answers(jobs)
        assert [call.ids for call in runtime.calls] == [[first, second]]

    run(scenario())


def test_the_wait_for_a_request_on_its_way_ends_at_max_wait_even_if_it_never_submits():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=300) as batcher:
            leave = asyncio.Event()
            on_its_way = await entered_expecting(batcher, leave)
            started = time.perf_counter()
            await answers([submit(batcher, *new_ids(1))], timeout=5)  # still on its way when this is answered
            elapsed = time.perf_counter() - started
            leave.set()
            await on_its_way
        assert elapsed >= 0.25, elapsed  # it did wait, for max_wait_ms

    run(scenario())


def test_a_request_that_leaves_without_submitting_ends_the_wait_at_once():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=2000) as batcher:
            leave = asyncio.Event()
            on_its_way = await entered_expecting(batcher, leave)
            job = submit(batcher, *new_ids(1))
            await asyncio.sleep(0.05)  # the lane waits for it
            started = time.perf_counter()
            leave.set()  # e.g. its input was too long: nothing comes
            await on_its_way
            await answers([job])
            elapsed = time.perf_counter() - started
        assert elapsed < 1.0, elapsed

    run(scenario())


def test_max_wait_counts_from_when_the_oldest_input_arrived_not_from_when_the_lane_got_to_it():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=1000) as batcher:
            blocker, waiting = new_ids(2)
            runtime.hold(blocker)
            submit(batcher, blocker)
            await runtime.reached(blocker)
            leave = asyncio.Event()
            on_its_way = await entered_expecting(batcher, leave)
            job = submit(batcher, waiting)
            await asyncio.sleep(1.1)  # its max_wait passes while the lane is busy
            released = time.perf_counter()
            runtime.release()
            await answers([job])
            elapsed = time.perf_counter() - released
            leave.set()
            await on_its_way
        assert elapsed < 0.5, elapsed  # it has waited its 1000 ms already

    run(scenario())


def test_a_full_batch_runs_without_waiting_for_requests_on_their_way():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=2000, max_batch_size=2) as batcher:
            leave = asyncio.Event()
            on_its_way = await entered_expecting(batcher, leave)
            started = time.perf_counter()
            await answers([submit(batcher, ident) for ident in new_ids(2)])
            elapsed = time.perf_counter() - started
            leave.set()
            await on_its_way
        assert elapsed < 1.0, elapsed
        assert [call.size for call in runtime.calls] == [2]

    run(scenario())


# -- long and short lanes --------------------------------------------------------------------


def test_short_inputs_complete_while_a_long_batch_is_blocked():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, long_bucket_min_length=1024) as batcher:
            document, *shorts = new_ids(4)
            runtime.hold(document)
            long_job = submit(batcher, document, length=1000)
            await runtime.reached(document)
            short_jobs = [submit(batcher, ident, length=n) for ident, n in zip(shorts, (10, 60, 250), strict=True)]
            assert_own_rows(short_jobs, await answers(short_jobs))
            assert not long_job.future.done()
            runtime.release()
            assert_own_rows([long_job], await answers([long_job]))

    run(scenario())


def test_buckets_from_long_bucket_min_length_up_share_the_long_lane():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, long_bucket_min_length=256) as batcher:
            held, longer, short, shorter = new_ids(4)
            runtime.hold(held)
            jobs = {held: submit(batcher, held, length=256)}
            await runtime.reached(held)
            for ident, n in ((longer, 1024), (short, 64), (shorter, 1)):
                jobs[ident] = submit(batcher, ident, length=n)
            await answers([jobs[short], jobs[shorter]])  # the short lane is free
            await asyncio.sleep(0.2)  # time enough for the 1024 input to run, were its lane free
            assert longer not in runtime.ran() and not jobs[longer].future.done()
            runtime.release()
            await answers(list(jobs.values()))
        thread = {ident: call.thread for call in runtime.calls for ident in call.ids}
        assert thread[held] == thread[longer] != thread[short] == thread[shorter]

    run(scenario())


# -- abandoned work is dropped ---------------------------------------------------------------


def test_a_cancelled_input_never_reaches_the_runtime_and_is_counted_as_dropped():
    async def scenario():
        runtime, metrics = FakeRuntime(), ServiceMetrics()
        async with serving(runtime, metrics) as batcher:
            blocker, first, second, third, fourth, other = new_ids(6)
            runtime.hold(blocker)
            submit(batcher, blocker)
            await runtime.reached(blocker)
            jobs = {ident: submit(batcher, ident) for ident in (first, second, third, fourth)}
            jobs[other] = submit(batcher, other, length=64)
            for gone in (first, third, other):  # the front of a queue, its middle, a queue of its own
                jobs[gone].future.cancel()  # the client went away
            runtime.release()
            await answers([jobs[second], jobs[fourth]])
        assert runtime.ran() == [blocker, second, fourth]
        assert sample(metrics, "bigs_dropped_inputs_total") == 3
        assert all(sample(metrics, "bigs_queue_depth", bucket=str(b)) == 0 for b in (16, 64))

    run(scenario())


def test_an_input_past_its_deadline_while_queued_fails_with_deadline_exceeded_and_never_runs():
    async def scenario():
        runtime, metrics = FakeRuntime(), ServiceMetrics()
        async with serving(runtime, metrics) as batcher:
            blocker, late, patient = new_ids(3)
            runtime.hold(blocker)
            submit(batcher, blocker)
            await runtime.reached(blocker)
            late_job = submit(batcher, late, deadline_s=0.05)
            patient_job = submit(batcher, patient)
            await asyncio.sleep(0.2)  # the deadline passes while the lane is busy
            runtime.release()
            assert_own_rows([patient_job], await answers([patient_job]))
            with pytest.raises(DeadlineExceeded):
                await asyncio.wait_for(late_job.future, HOLD_S)
        assert late not in runtime.ran()
        assert sample(metrics, "bigs_dropped_inputs_total") == 1

    run(scenario())


# -- failures and shutdown -------------------------------------------------------------------


def test_a_runtime_failure_fails_only_its_batch_and_the_lane_serves_on():
    async def scenario():
        runtime, metrics = FakeRuntime(), ServiceMetrics()
        async with serving(runtime, metrics) as batcher:
            bad, neighbour, elsewhere, later = new_ids(4)
            runtime.failing.add(bad)
            failed = [submit(batcher, bad), submit(batcher, neighbour)]  # one batch of bucket 16
            fine = submit(batcher, elsewhere, length=64)  # same lane, another batch
            outcomes = await asyncio.wait_for(asyncio.gather(*(j.future for j in failed), return_exceptions=True), 5)
            assert all(isinstance(o, RuntimeFailure) and "injected" in str(o) for o in outcomes), outcomes
            assert_own_rows([fine], await answers([fine]))
            again = submit(batcher, later)
            assert_own_rows([again], await answers([again]))
        assert [call.ids for call in runtime.calls] == [[bad, neighbour], [elsewhere], [later]]
        assert sample(metrics, "bigs_runtime_errors_total", bucket="16") == 1
        assert sample(metrics, "bigs_runtime_errors_total", bucket="64") == 0

    run(scenario())


def test_a_runtime_answering_too_few_rows_fails_only_its_batch_and_the_lane_serves_on():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime) as batcher:
            bad, neighbour, later = new_ids(3)
            runtime.short_of_rows.add(bad)
            batch = [submit(batcher, bad), submit(batcher, neighbour)]
            await asyncio.wait([job.future for job in batch], timeout=1.0)  # instant when the batcher copes
            assert all(job.future.done() for job in batch), "an input of the malformed batch was never answered"
            for job in batch:
                assert job.future.exception() is None or isinstance(job.future.exception(), RuntimeFailure)
            again = submit(batcher, later)
            assert_own_rows([again], await answers([again], timeout=1.0))

    run(scenario())


def test_stop_computes_every_queued_input_then_refuses_new_ones():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_batch_size=4) as batcher:
            blocker, *ids = new_ids(12)
            runtime.hold(blocker)
            jobs = [submit(batcher, blocker)]
            await runtime.reached(blocker)
            lengths = itertools.cycle([10, 60, 1000])  # three queues, both lanes
            jobs += [submit(batcher, ident, length=next(lengths)) for ident in ids]
            stopping = asyncio.create_task(batcher.stop())
            await asyncio.sleep(0.05)
            assert not stopping.done()  # draining
            runtime.release()
            await asyncio.wait_for(stopping, HOLD_S)
            assert all(job.future.done() for job in jobs)
            assert_own_rows(jobs, [job.future.result() for job in jobs])
            with pytest.raises(RuntimeError, match="shutting down"):
                submit(batcher, *new_ids(1))
        assert sorted(runtime.ran()) == [blocker, *ids]

    run(scenario())


def test_stop_does_not_wait_for_requests_on_their_way():
    async def scenario():
        runtime = FakeRuntime()
        async with serving(runtime, max_wait_ms=2000) as batcher:
            leave = asyncio.Event()
            on_its_way = await entered_expecting(batcher, leave)
            job = submit(batcher, *new_ids(1))
            await asyncio.sleep(0.05)  # the lane is waiting for the request on its way
            started = time.perf_counter()
            await asyncio.wait_for(batcher.stop(), HOLD_S)
            elapsed = time.perf_counter() - started
            assert_own_rows([job], [job.future.result()])
            leave.set()
            await on_its_way
        assert elapsed < 1.0, elapsed

    run(scenario())


# -- fill-mask and warm-up -------------------------------------------------------------------


def test_fill_mask_jobs_get_back_only_their_own_mask_positions():
    async def scenario():
        runtime = FakeRuntime(heads=("fill-mask",))
        positions = [[1], [1, 2, 3], [4, 5], [2]]
        async with serving(runtime) as batcher:
            ids = new_ids(len(positions))
            jobs = [
                submit(batcher, i, head="fill-mask", length=10, mask_positions=p)
                for i, p in zip(ids, positions, strict=True)
            ]
            results = await answers(jobs)
        (call,) = runtime.calls
        want = pad_positions([np.asarray(p) for p in positions], 3)
        np.testing.assert_array_equal(call.inputs["mask_positions"], want)
        for ident, p, result in zip(ids, positions, results, strict=True):
            assert result.tolist() == [[ident, position] for position in p]

    run(scenario())


def test_warm_up_reports_each_bucket_once_shortest_first_with_its_shapes():
    runtime = FakeRuntime(heads=("fill-mask", "classification"), buckets=[1024, 16])
    every = settings(max_batch_tokens=4096, max_batch_size=8, warmup_batches="all")
    batcher = ModelBatcher(MODEL, runtime, every, ServiceMetrics())
    done = []
    batcher.warm_up(lambda bucket, shapes: done.append((bucket, shapes, len(runtime.calls))))
    # 16: batches 1, 2, 4, 8 for each of two heads; 1024: 1, 2, 4; each reported after its runs
    assert done == [(16, 8, 8), (1024, 6, 14)]


def test_warm_up_first_runs_batch_one_of_each_head_and_bucket_and_auto_all_only_where_xla_compiles():
    for policy, kind, sizes in (("first", "fake", [1]), ("auto", "fake", [1]), ("auto", "stablehlo", [1, 2, 4, 8])):
        runtime = FakeRuntime(heads=("fill-mask", "classification"), buckets=[16])
        runtime.kind = kind
        chosen = settings(max_batch_tokens=4096, max_batch_size=8, warmup_batches=policy)
        batcher = ModelBatcher(MODEL, runtime, chosen, ServiceMetrics())
        batcher.warm_up()
        want = sorted((h, 16, n) for h in runtime.heads for n in sizes)
        assert sorted((c.head, c.bucket, c.size) for c in runtime.calls) == want, (policy, kind)
        assert sorted(batcher.warm_shapes()) == want and len(batcher.shapes()) == 8


def test_where_the_heads_share_one_graph_a_bucket_warm_up_runs_the_first_head_alone():
    """ONNX Runtime's session and OpenVINO's compiled model answer every head of a bucket from one graph:
    warming a second head would run the same graph at the same shape again."""
    runtime = FakeRuntime(heads=("fill-mask", "embeddings"), buckets=[16, 1024])
    runtime.heads_share_a_graph = True
    batcher = ModelBatcher(MODEL, runtime, settings(max_batch_tokens=4096, max_batch_size=8), ServiceMetrics())
    batcher.warm_up()
    assert sorted((c.head, c.bucket, c.size) for c in runtime.calls) == [("fill-mask", 16, 1), ("fill-mask", 1024, 1)]
    assert {head for head, _, _ in batcher.shapes()} == {"fill-mask"}
    assert {head for head, _, _ in batcher.emitted_shapes()} == {"fill-mask", "embeddings"}


def test_the_long_lane_warms_its_own_buckets_on_its_thread_before_its_first_batch():
    """`warmup_long_lane` after-ready: warm-up before ready runs the short lane's buckets only; once the lanes run,
    the long lane's warm-up goes first on the long lane's thread, so a long input submitted right after it runs
    after it, warm, and the short lane answers meanwhile."""
    runtime = FakeRuntime(heads=("classification",), buckets=[16, 1024])
    batcher = ModelBatcher(MODEL, runtime, settings(), ServiceMetrics())
    batcher.warm_up(lanes=("short",))
    assert [(c.bucket, c.ids) for c in runtime.calls] == [(16, [0])]
    runtime.calls.clear()
    warmed = []

    async def scenario():
        batcher.start()
        runtime.hold(0)  # the long lane's warm-up (input id 0) is held inside the runtime
        warming = batcher.warm_long_lane(lambda seconds, buckets: warmed.append(buckets))
        assert warming is not None
        await runtime.reached(0)
        long_one, short_one = new_ids(2)
        long_job, short_job = submit(batcher, long_one, length=1000), submit(batcher, short_one, length=10)
        await answers([short_job])  # the short lane is not held by the long one's warm-up
        assert not long_job.future.done()
        runtime.release()
        await answers([long_job])
        await asyncio.wrap_future(warming)
        await batcher.stop()
        ids.extend([long_one, short_one])

    ids: list[int] = []
    run(scenario())
    long_one, _ = ids
    assert warmed == [[1024]]
    on_long = [(c.bucket, c.ids) for c in runtime.calls if c.bucket == 1024]
    assert on_long == [(1024, [0]), (1024, [long_one])]  # the warm-up first, then the input
    assert {c.thread for c in runtime.calls if c.bucket == 1024} == {f"{MODEL}-long_0"}
    only_short = ModelBatcher(MODEL, FakeRuntime(buckets=[16, 64]), settings(), ServiceMetrics())
    assert only_short.warm_long_lane(lambda *_: None) is None  # and none where no bucket is long


def test_warm_up_all_runs_every_shape_exactly_once():
    runtime = FakeRuntime(heads=("fill-mask", "classification"), buckets=[16, 1024])
    every = settings(max_batch_tokens=4096, max_batch_size=8, warmup_batches="all")
    batcher = ModelBatcher(MODEL, runtime, every, ServiceMetrics())
    batcher.warm_up()
    want = [(h, b, n) for h in runtime.heads for b, sizes in ((16, [1, 2, 4, 8]), (1024, [1, 2, 4])) for n in sizes]
    assert sorted(batcher.shapes()) == sorted(want)
    assert sorted((call.head, call.bucket, call.size) for call in runtime.calls) == sorted(want)
    for call in runtime.calls:
        assert call.inputs["input_ids"].shape == (call.size, call.bucket)
        assert ("mask_positions" in call.inputs) == (call.head == "fill-mask")
