"""Prometheus metrics, one registry per app (so several apps in one process never collide)."""

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

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
