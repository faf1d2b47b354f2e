"""Per-request telemetry: the request's id, its record of where the time went, and what is made of
that record once the request is answered: metrics, one log line and, when OpenTelemetry is
configured, a trace.

The `Observe` middleware (service/app.py), outermost, opens a `RequestRecord` for every HTTP request
and makes it the current one (a context variable: the route, the engine and the error handlers run
in the request's task, or in worker threads that copy its context). The stages that learn something
write it there, and nothing else passes it around:

    engine.py    the model, the number of inputs, their tokens, the tokenization's start and length,
                 the jobs (each carries its queue time, inference time, bucket and batch size)
    errors.py    the `error_type` of the JSON error answered

When the response has been sent, `Telemetry.finish` turns the record into the per-model histograms
and the failure counter (service/metrics.py), the request's log line (logger `bigs.access`,
service/logs.py formats it as text or JSON) and, with tracing on, a span with a child per stage.

Request ids: a client's `X-Request-ID` is kept when it is 1-128 characters of `[A-Za-z0-9._:@/+=-]`
(what proxies and tracing systems generate: UUIDs, hex, base64); any other value is replaced by a
generated one, never refused (a request is not failed for a header meant for its logs), and the
id used is echoed on every response.
"""

from __future__ import annotations

import logging
import os
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .metrics import ServiceMetrics

if TYPE_CHECKING:
    from .batcher import Job

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID = 128
_ACCEPTED_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,%d}" % MAX_REQUEST_ID)

access_log = logging.getLogger("bigs.access")
# What orchestrators poll (Kubernetes' startup, readiness and liveness probes; the image's HEALTHCHECK): every few
# seconds for as long as the pod lives, and /ready answers 503 until the models are warm. Such an answer is the
# probe's news, not the service's trouble, so a probe's line is logged at the access log's quietest level, INFO,
# whatever its status (a 500 stays an error), or not at all (`log_probes` off).
PROBE_PATHS = frozenset({"/health", "/ready"})
REQUEST_LINE = '%s - "%s %s" %d'  # client - "METHOD /path" status, as uvicorn's access line
log = logging.getLogger("bigs")


def request_id_from(given: bytes | None) -> str:
    """The client's id when acceptable (bounded length and charset), else a new one (32 hex digits)."""
    if given is not None and _ACCEPTED_ID.fullmatch(given):
        return given.decode("ascii")
    return os.urandom(16).hex()  # as random as uuid4, a fifth of its cost


@dataclass(slots=True)
class RequestRecord:
    """What one HTTP request did and where its time went; perf_counter seconds unless named `_ms`."""

    id: str
    method: str
    path: str
    client: str | None
    started: float
    route: str | None = None  # the route's path template, once routed
    status: int = 500
    error_type: str | None = None
    model: str = ""  # the served model that answered ("" before one was chosen)
    inputs: int = 0
    tokens: int = 0
    tokenize_started: float | None = None
    tokenize_s: float | None = None
    jobs: list[Job] = field(default_factory=list)

    @property
    def queue_s(self) -> float | None:
        """The slowest input's queue time (what the `x-queue-time` header says too)."""
        return max(job.queue_s for job in self.jobs) if self.jobs else None

    @property
    def inference_s(self) -> float | None:
        return max(job.inference_s for job in self.jobs) if self.jobs else None

    def fields(self, total_s: float) -> dict:
        """The log line's fields (docs/DESIGN.md §4.10)."""
        queue, inference = self.queue_s, self.inference_s
        return {
            "request_id": self.id,
            "method": self.method,
            "route": self.route,
            "path": self.path,
            "model": self.model or None,
            "status": self.status,
            "error_type": self.error_type,
            "inputs": self.inputs,
            "tokens": self.tokens,
            "tokenize_ms": _ms(self.tokenize_s),
            "queue_ms": _ms(queue),
            "inference_ms": _ms(inference),
            "total_ms": _ms(total_s),
            "client": self.client,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


_current: ContextVar[RequestRecord | None] = ContextVar("bigs_request", default=None)


def current() -> RequestRecord | None:
    """The record of the request being served here, or None outside a request (a direct engine call)."""
    return _current.get()


def note_model(name: str) -> None:
    record = _current.get()
    if record is not None:
        record.model = name


def note_error(error_type: str) -> None:
    record = _current.get()
    if record is not None:
        record.error_type = error_type


class Telemetry:
    """One app's telemetry: its metrics, whether requests are logged, and its tracer (or None)."""

    def __init__(self, metrics: ServiceMetrics, log_requests: bool, tracing: Tracing | None, log_probes: bool = True):
        self.metrics, self.log_requests, self.tracing = metrics, log_requests, tracing
        self.log_probes = log_probes  # the lines of PROBE_PATHS (off: none; on: at INFO unless a 500)
        # (endpoint, status) -> its request counter and latency histogram: `labels()` costs twice an update
        self._per_endpoint: dict[tuple[str, str], tuple] = {}

    def start(self, scope) -> tuple[RequestRecord, object]:
        """Open the request's record and make it current; (record, token to `finish` with)."""
        given = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                given = value
                break
        client = scope.get("client")
        record = RequestRecord(
            id=request_id_from(given),
            method=scope["method"],
            path=scope["path"],
            client=f"{client[0]}:{client[1]}" if client else None,
            started=time.perf_counter(),
        )
        return record, _current.set(record)

    def finish(self, record: RequestRecord, token, scope, error: BaseException | None = None) -> None:
        """The request has been answered: metrics, its log line, its trace."""
        _current.reset(token)
        ended = time.perf_counter()
        total = ended - record.started
        route = scope.get("route")
        record.route = route.path if route is not None else None
        endpoint = record.route or "unmatched"
        status = str(record.status)
        counted = self._per_endpoint.get((endpoint, status))
        if counted is None:
            counted = (
                self.metrics.requests.labels(endpoint, status),
                self.metrics.request_latency.labels(endpoint, status),
            )
            self._per_endpoint[(endpoint, status)] = counted
        counted[0].inc()
        counted[1].observe(total)
        if record.status >= 400:
            self.metrics.failures.labels(record.model, endpoint, status, record.error_type or "http").inc()
        trace_id = None
        if self.tracing is not None:
            trace_id = self.tracing.record(record, scope, ended)
        probe = record.path in PROBE_PATHS
        if self.log_requests and (self.log_probes or not probe):
            fields = record.fields(total)
            if trace_id is not None:
                fields["trace_id"] = trace_id
            level = access_level(record.status, probe)
            if access_log.isEnabledFor(level):
                # made directly, not through `log()`: that looks up the caller's file and line in the stack
                # for every line, a third of the cost of a request's line, for a location that never changes
                args = (record.client or "-", record.method, record.path, record.status)
                exc_info = (type(error), error, error.__traceback__) if error is not None else None
                line = access_log.makeRecord(
                    access_log.name, level, __file__, 0, REQUEST_LINE, args, exc_info, extra={"fields": fields}
                )
                access_log.handle(line)


def access_level(status: int, probe: bool) -> int:
    """The level of a request's line: error where the service failed (500); warning where it could not serve
    now (503 not ready or overloaded, 504 deadline), unless the request was a probe (PROBE_PATHS), whose 503
    before ready is its expected answer; info for the rest."""
    if status == 500:
        return logging.ERROR
    return logging.WARNING if status > 500 and not probe else logging.INFO


# -- tracing (the `otel` extra) ----------------------------------------------------------------


def tracing_from_environment(service_version: str, environ=os.environ) -> Tracing | None:
    """A `Tracing` when OpenTelemetry's standard variables configure an exporter, else None.

    On when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or
    OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`); off with OTEL_SDK_DISABLED=true or
    OTEL_TRACES_EXPORTER=none. OTLP goes over HTTP/protobuf (port 4318), unless OTEL_EXPORTER_OTLP_PROTOCOL
    (or its _TRACES_ form) says grpc and the gRPC exporter is installed. Configured without the
    `otel` extra installed: a warning, and no tracing."""
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or exporter == "none":
        return None
    if not exporter and not endpoint:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "OpenTelemetry tracing is configured (OTEL_* variables) but its packages are not installed "
            "(pip install 'bigs-serving[otel]'): requests are not traced"
        )
        return None
    exporter = exporter or "otlp"
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    elif exporter == "otlp":
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        try:
            if protocol.strip().lower() == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("the OTLP exporter for protocol %r is not installed: requests are not traced", protocol)
            return None
        span_exporter = OTLPSpanExporter()  # endpoint, headers, timeout: from the OTEL_EXPORTER_OTLP_* variables
    else:
        log.warning("OTEL_TRACES_EXPORTER=%r is not supported (otlp, console, none): requests are not traced", exporter)
        return None
    # service.name: OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) when given, else "bigs-serving"
    attributes = {"service.version": service_version}
    if not environ.get("OTEL_SERVICE_NAME") and "service.name=" not in environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = "bigs-serving"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return Tracing(provider, service_version)


class Tracing:
    """Spans, written when a request has been answered, from its record: one SERVER span per request
    (a child of the caller's span when it sent W3C `traceparent`), and under it `tokenize`, and a `queue`
    and an `inference` span for each batch the request's inputs ran in. The spans are exported in the
    background (BatchSpanProcessor), never on the request's path."""

    def __init__(self, provider, service_version: str):
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        self.provider = provider
        self.tracer = provider.get_tracer("bigs-serving", service_version)
        self._extract, self._in_context = extract, set_span_in_context
        self._server, self._error = SpanKind.SERVER, Status(StatusCode.ERROR)

    def record(self, record: RequestRecord, scope, ended: float) -> str:
        """Write the request's spans; its trace id (32 hex digits, for the log line)."""
        now_ns, now = time.time_ns(), time.perf_counter()

        def ns(at: float) -> int:
            return now_ns - int((now - at) * 1e9)

        carrier = {}
        for name, value in scope["headers"]:
            if name in (b"traceparent", b"tracestate"):
                carrier[name.decode()] = value.decode("latin-1")
        name = f"{record.method} {record.route}" if record.route else record.method
        attributes = {
            "http.request.method": record.method,
            "url.path": record.path,
            "http.response.status_code": record.status,
            "bigs.request_id": record.id,
            "bigs.inputs": record.inputs,
            "bigs.tokens": record.tokens,
        }
        if record.route:
            attributes["http.route"] = record.route
        if record.client:
            attributes["client.address"] = record.client.rpartition(":")[0]
        if record.model:
            attributes["bigs.model"] = record.model
        if record.error_type:
            attributes["error.type"] = record.error_type
        span = self.tracer.start_span(
            name,
            context=self._extract(carrier) if carrier else None,
            kind=self._server,
            attributes=attributes,
            start_time=ns(record.started),
        )
        if record.status >= 500:
            span.set_status(self._error)
        inside = self._in_context(span)
        model = {"bigs.model": record.model} if record.model else {}
        if record.tokenize_started is not None and record.tokenize_s is not None:
            self.tracer.start_span(
                "tokenize", inside, attributes={**model, "bigs.inputs": record.inputs, "bigs.tokens": record.tokens},
                start_time=ns(record.tokenize_started),
            ).end(ns(record.tokenize_started + record.tokenize_s))  # fmt: skip
        batches: dict[tuple[int, float], list[Job]] = {}  # the request's inputs by the batch they ran in
        for job in record.jobs:
            if job.batch_size:  # ran (not dropped)
                batches.setdefault((job.bucket, job.enqueued + job.queue_s), []).append(job)
        for (bucket, batch_started), jobs in batches.items():
            batch = {
                **model,
                "bigs.bucket": bucket,
                "bigs.batch_size": jobs[0].batch_size,
                "bigs.inputs": len(jobs),
                "bigs.tokens": sum(job.encoded.length for job in jobs),
            }
            queued = min(job.enqueued for job in jobs)
            self.tracer.start_span("queue", inside, attributes=batch, start_time=ns(queued)).end(ns(batch_started))
            self.tracer.start_span("inference", inside, attributes=batch, start_time=ns(batch_started)).end(
                ns(batch_started + jobs[0].inference_s)
            )
        span.end(ns(ended))
        return format(span.get_span_context().trace_id, "032x")

    def shutdown(self) -> None:
        """Export what is buffered, then stop (blocking: at most the exporter's timeout)."""
        self.provider.shutdown()
