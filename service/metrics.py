"""Prometheus metrics, one registry per app (so several apps in one process never collide).

Names follow Prometheus' conventions: base units (`_seconds`), counters end in `_total` (the client
library appends it to a Counter's name), label values from a bounded set: `model` is a served
model's name (never a name a client sent), `endpoint` a route's path template (or "unmatched"),
`error_type` the `error_type` of the JSON error body. docs/DESIGN.md §4.10 lists them."""

from __future__ import annotations

from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60)
# Stages of one request are far shorter than the request: tokenizing a sentence takes ~0.1 ms.
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Input lengths in tokens, special tokens included: powers of two up to the longest bucket (4,096 for the
# defaults; 16,384 for an export that tiles its positions past them, `bigs export --tile-positions`).
LENGTH_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class ServiceMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        # process_resident_memory_bytes, process_cpu_seconds_total, open fds…; python_info
        ProcessCollector(registry=r)
        r.register(PLATFORM_COLLECTOR)
        self.requests = Counter("bigs_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.request_latency = Histogram(
            "bigs_request_latency_seconds", "HTTP request latency", ["endpoint", "status"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("bigs_requests_in_flight", "requests admitted and not answered", registry=r)
        self.rejected = Counter(
            "bigs_rejected", "requests refused by admission (429), by the bound they hit: requests or tokens",
            ["bound"], registry=r,
        )  # fmt: skip
        self.tokens_in_flight = Gauge(
            "bigs_tokens_in_flight", "padded token positions of the admitted requests not yet computed, per lane",
            ["lane"], registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge("bigs_queue_depth", "inputs waiting", ["model", "bucket"], registry=r)
        self.batch_size = Histogram(
            "bigs_batch_size", "inputs per runtime call", ["model", "bucket"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r,
        )  # fmt: skip
        self.bucket_latency = Histogram(
            "bigs_batch_latency_seconds", "runtime call latency", ["model", "bucket"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tokens_computed = Counter(
            "bigs_tokens_computed", "token positions run through the model (padding included)", ["model", "bucket"],
            registry=r,
        )  # fmt: skip
        self.tokens_real = Counter("bigs_tokens_real", "real (non-pad) tokens", ["model", "bucket"], registry=r)
        self.dropped = Counter(
            "bigs_dropped_inputs", "queued inputs dropped (deadline passed or client gone)", ["model"], registry=r
        )
        self.runtime_errors = Counter("bigs_runtime_errors", "failed runtime calls", ["model", "bucket"], registry=r)

        # Per request and per input, by model (docs/DESIGN.md §4.10).
        self.tokenization = Histogram(
            "bigs_tokenization_seconds", "time to tokenize one request's inputs (all of them, in a worker thread), "
            "per request", ["model"], buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "bigs_queue_seconds", "time one input waited in its batch queue before its batch started, per input",
            ["model"], buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.inference_time = Histogram(
            "bigs_inference_seconds", "runtime time of the batch one input ran in, per input "
            "(bigs_batch_latency_seconds counts each batch once)", ["model"], buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.input_tokens = Histogram(
            "bigs_input_tokens", "tokens of one input, special tokens included, padding not, per input", ["model"],
            buckets=LENGTH_BUCKETS, registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "bigs_request_failures", "requests answered with an error, by the error_type of the JSON error body and "
            "the status; model is empty when the request failed before one was chosen",
            ["model", "endpoint", "status", "error_type"], registry=r,
        )  # fmt: skip

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
