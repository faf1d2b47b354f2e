"""What the request telemetry costs per request, in process: the record, the metrics, the log line.

    python -m bench.telemetry_cost

Runs, interleaved, three times each and keeps each one's best: the service's telemetry
(service/telemetry.py) for one request with the per-model histograms the engine and the batcher
update, with no log line, a text line and a JSON line (written to /dev/null through the service's
own logging configuration); and, for comparison, what the request path paid before it existed:
two metrics per request and uvicorn's access line. Microseconds per request; the CPU is printed.
"""

from __future__ import annotations

import logging
import logging.config
import time

from export.cpu import cpu_description
from service import logs
from service.metrics import ServiceMetrics
from service.telemetry import Telemetry

N = 20_000


class _Route:
    path = "/v1/embed"


SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/embed",
    "client": ("127.0.0.1", 5555),
    "route": _Route(),
    "headers": [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"30")],
}


def best_of(function, repeats: int = 5) -> float:
    """The fastest of `repeats` runs of `function` (N requests each), in microseconds per request."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, (time.perf_counter() - started) / N)
    return best * 1e6


def telemetry(log_format: str, log_requests: bool) -> float:
    logs.configure(log_format)
    logging.getLogger("bigs.access").handlers[0].setStream(open("/dev/null", "w"))  # noqa: SIM115
    t = Telemetry(ServiceMetrics(), log_requests, None)
    m = t.metrics
    per_model = [m.tokenization.labels("m"), m.input_tokens.labels("m"), m.queue_time.labels("m")]
    inference = m.inference_time.labels("m")

    def requests():
        for _ in range(N):
            record, token = t.start(SCOPE)
            record.status, record.model, record.inputs, record.tokens = 200, "m", 1, 8
            record.tokenize_started, record.tokenize_s = record.started, 1e-4
            for histogram in per_model:  # what the engine and the batcher observe for a one-input request
                histogram.observe(1e-4)
            inference.observe(2e-2)
            t.finish(record, token, SCOPE)

    return best_of(requests)


def before() -> float:
    """The request path before: a counter and a histogram per request, and uvicorn's access line."""
    from uvicorn.config import LOGGING_CONFIG

    logging.config.dictConfig(LOGGING_CONFIG)
    access = logging.getLogger("uvicorn.access")
    access.handlers[0].setStream(open("/dev/null", "w"))  # noqa: SIM115
    m = ServiceMetrics()

    def requests():
        for _ in range(N):
            started = time.perf_counter()
            m.requests.labels("/v1/embed", "200").inc()
            m.request_latency.labels("/v1/embed", "200").observe(time.perf_counter() - started)
            access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5555", "POST", "/v1/embed", "1.1", 200)

    return best_of(requests)


def main() -> None:
    cases = {
        "before: 2 metrics + uvicorn's access line": before,
        "telemetry, no log line": lambda: telemetry("json", False),
        "telemetry, text line": lambda: telemetry("text", True),
        "telemetry, JSON line": lambda: telemetry("json", True),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(3):  # interleaved: the machine's noise falls on every case alike
        for name, case in cases.items():
            results[name].append(case())
    print(f"per-request cost, microseconds (best of 3 x 5 runs of {N:,}); {cpu_description()}")
    base = min(results["before: 2 metrics + uvicorn's access line"])
    for name, values in results.items():
        print(f"  {name:45s} {min(values):6.1f}  ({min(values) / base:.2f}x)")


if __name__ == "__main__":
    main()
