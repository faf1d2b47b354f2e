"""Admission: how much work the service takes on at once. Past either bound the answer is 429 with
Retry-After, at once, rather than a queue whose answers would only come after their deadline.

Two bounds, each checked where it can first be known:

- requests in flight (`max_in_flight`): a permit is taken by the `Admit` middleware
  (service/app.py) once the body has arrived and before it is parsed or validated, so refusing a
  request under overload costs a byte count, not a JSON parse. Not earlier: a client that sends
  its body slowly would hold a permit for up to `body_timeout_s` while sending nothing useful.
  The permit is held until the response has been sent.
- token positions in flight (`max_tokens_in_flight`, per lane): taken by the engine
  (service/engine.py) once the inputs are tokenized and their buckets known, counted as the padded
  positions the runtime will compute, and held until the answer is computed. Counted per lane
  (short and long buckets run on lanes of their own, service/batcher.py), since a lane's queue is
  what a new input waits behind: long documents filling the long lane do not turn short requests
  away. In a lane that no other request holds tokens of, a request is admitted however large it
  is within the per-request limits: every valid request can be served by a quiet server.

Both are closed (503, "not_ready") until the service is ready and again once shutdown begins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .errors import ServiceError
from .metrics import ServiceMetrics

RETRY = {"Retry-After": "1"}


class Admission:
    def __init__(self, max_in_flight: int, max_tokens_in_flight: int, metrics: ServiceMetrics):
        self.max_in_flight, self.max_tokens_in_flight, self.metrics = max_in_flight, max_tokens_in_flight, metrics
        self.in_flight = 0
        self.tokens_in_flight: Counter[str] = Counter()  # lane -> padded positions held
        self.open = False

    def enter(self) -> None:
        """Take a request permit (the caller calls `leave` once answered), or raise 503 / 429."""
        if not self.open:
            raise ServiceError(503, "not_ready", "the service is starting or shutting down", RETRY)
        if self.in_flight >= self.max_in_flight:
            self.metrics.rejected.labels("requests").inc()
            raise ServiceError(429, "overloaded", "too many requests in flight; retry shortly", RETRY)
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)

    @contextmanager
    def tokens(self, by_lane: Mapping[str, int]) -> Iterator[None]:
        """Hold these padded token positions (lane -> count) while the block runs, or raise 429 when
        they would take a lane past `max_tokens_in_flight` (unless no other request holds any there)."""
        for lane, count in by_lane.items():
            held = self.tokens_in_flight[lane]
            if held and held + count > self.max_tokens_in_flight:
                self.metrics.rejected.labels("tokens").inc()
                message = (
                    f"this request's {count:,} token positions would take the {lane} lane past its "
                    f"{self.max_tokens_in_flight:,} in flight; retry shortly"
                )
                raise ServiceError(429, "overloaded", message, RETRY)
        self._hold(by_lane, +1)
        try:
            yield
        finally:
            self._hold(by_lane, -1)

    def _hold(self, by_lane: Mapping[str, int], sign: int) -> None:
        for lane, count in by_lane.items():
            self.tokens_in_flight[lane] += sign * count
            self.metrics.tokens_in_flight.labels(lane).set(self.tokens_in_flight[lane])
