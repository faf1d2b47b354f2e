"""Observability of the request path (docs/DESIGN.md §4.10), against a real `bigs serve`.

One server (the tiny fill-mask and classification models of tests/service_fixtures.py) logs JSON
and traces to a real OTLP/HTTP receiver started here: an HTTP server that decodes the protobuf
export requests with `opentelemetry-proto`, as a collector would. Checked: the per-model stage
histograms move by what was sent and only for the model that answered; failures are counted by
error_type and status; X-Request-ID is kept or replaced and echoed on every answer; one JSON log line
per request carries its fields, and uvicorn logs none of its own; the receiver gets a span per
request with its stages as children, in the caller's trace.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from service_fixtures import HOST, Server, masked_text, metric, metric_samples, text_of

pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

pytestmark = pytest.mark.slow  # a server of its own (seconds to start)

GENERATED_ID = re.compile(r"[0-9a-f]{32}")


class OTLPReceiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf body (gzip or not), spans kept decoded."""

    def __init__(self):
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.path == "/v1/traces", self.path
                assert self.headers["Content-Type"] == "application/x-protobuf", self.headers
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_span_id": span.parent_span_id.hex(),
                                "kind": span.kind,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "resource": resource,
                            }
                        )

    def trace(self, trace_id: str, spans: int, timeout: float = 20) -> list[dict]:
        """The spans of `trace_id`, once `spans` of them have arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s["trace_id"] == trace_id]
            if len(found) >= spans:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{len(found)} spans of trace {trace_id} arrived, not {spans}: {found}")

    def stop(self) -> None:
        self.server.shutdown()


def _value(any_value):
    return getattr(any_value, any_value.WhichOneof("value"))


@pytest.fixture(scope="module")
def receiver():
    r = OTLPReceiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def observed(exports, logs, receiver):
    """fill + cls, JSON logs, traces exported to `receiver` every 100 ms."""
    server = Server(
        {"fill": exports["mlm"], "cls": exports["cls"]},
        logs,
        "observed",
        BIGS_LOG_FORMAT="json",
        BIGS_WARMUP="false",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_SERVICE_NAME="bigs-test",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(observed):
    with httpx.Client(base_url=observed.url, timeout=60) as c:
        yield c


def scrape(client) -> dict:
    return metric_samples(client.get("/metrics").text)


def log_lines(server: Server, request_id: str, timeout: float = 10) -> list[dict]:
    """The server's JSON log lines of the request `request_id` (waiting for the first to be written)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if request_id in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


# -- metrics ------------------------------------------------------------------------------------


def test_stage_histograms_move_by_what_was_sent_and_only_for_the_model_that_answered(client):
    before = scrape(client)
    lengths = [9, 40, 130]  # tokens, [CLS] and [SEP] included; 130 goes to the 512 bucket
    response = client.post("/v1/classify", json={"inputs": [text_of(n, seed=n) for n in lengths]})
    assert response.status_code == 200, response.text
    after = scrape(client)

    def delta(name, model):
        return metric(after, name, model=model) - metric(before, name, model=model)

    assert delta("bigs_tokenization_seconds_count", "cls") == 1  # per request
    assert delta("bigs_tokenization_seconds_sum", "cls") > 0
    assert delta("bigs_input_tokens_count", "cls") == 3  # per input
    assert delta("bigs_input_tokens_sum", "cls") == sum(lengths)
    assert delta("bigs_input_tokens_bucket", "cls") > 0
    assert metric(after, "bigs_input_tokens_bucket", model="cls", le="8.0") == metric(
        before, "bigs_input_tokens_bucket", model="cls", le="8.0"
    )  # none of them is 8 tokens or fewer
    assert (
        metric(after, "bigs_input_tokens_bucket", model="cls", le="16.0")
        - metric(before, "bigs_input_tokens_bucket", model="cls", le="16.0")
        == 1
    )
    for name in ("bigs_queue_seconds_count", "bigs_inference_seconds_count"):  # per input
        assert delta(name, "cls") == 3, name
    assert delta("bigs_inference_seconds_sum", "cls") > 0
    for name in ("bigs_tokenization_seconds_count", "bigs_input_tokens_count", "bigs_queue_seconds_count"):
        assert delta(name, "fill") == 0, name

    before = after
    assert client.post("/v1/fill-mask", json={"inputs": masked_text(12)}).status_code == 200
    after = scrape(client)
    assert delta("bigs_input_tokens_sum", "fill") == 12 and delta("bigs_inference_seconds_count", "fill") == 1
    assert delta("bigs_input_tokens_count", "cls") == 0


def test_a_failure_is_counted_by_its_error_type_status_and_model(client):
    before = scrape(client)
    too_long = client.post("/v1/classify", json={"inputs": text_of(600)})
    unknown = client.post("/v1/classify", json={"inputs": "a", "model": "nope"})
    invalid = client.post("/v1/classify", json={"inputs": "a", "parameters": {"top_k": "5"}})
    missing = client.get("/v1/nothing")
    huge = client.post(
        "/v1/classify", content=b" " * (4 * 1024 * 1024 + 1), headers={"content-type": "application/json"}
    )
    statuses = [r.status_code for r in (too_long, unknown, invalid, missing, huge)]
    assert statuses == [413, 400, 422, 404, 413]
    after = scrape(client)

    def delta(**labels):
        return metric(after, "bigs_request_failures_total", **labels) - metric(
            before, "bigs_request_failures_total", **labels
        )

    assert delta(model="cls", endpoint="/v1/classify", status="413", error_type="too_long") == 1
    assert delta(model="", endpoint="/v1/classify", status="400", error_type="unknown_model") == 1
    assert delta(model="", endpoint="/v1/classify", status="422", error_type="validation") == 1
    assert delta(model="", endpoint="unmatched", status="404", error_type="not_found") == 1
    # refused by the body limit before routing, and still counted under the route it was sent to
    assert delta(model="", endpoint="/v1/classify", status="413", error_type="body_too_large") == 1
    assert delta() == 5  # and nothing else: the successes are not failures


def test_an_unhandled_exception_is_a_json_500_with_the_request_id_logged_with_its_traceback(caplog):
    """In process: a route that raises (no route of the service does; this one is added for the test)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    app = create_app(ServiceSettings(models=[]))

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug")

    with caplog.at_level(logging.INFO, logger="bigs.access"):
        response = TestClient(app).get("/boom", headers={"X-Request-ID": "boom-1"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "boom-1"
    assert response.json() == {"error": "RuntimeError: a bug", "error_type": "internal"}
    (record,) = [r for r in caplog.records if r.name == "bigs.access"]
    assert record.levelname == "ERROR" and record.exc_info[0] is RuntimeError
    assert (record.fields["request_id"], record.fields["route"], record.fields["error_type"]) == (
        "boom-1",
        "/boom",
        "internal",
    )
    samples = metric_samples(app.state.service.metrics.exposition().decode())
    assert metric(samples, "bigs_request_failures_total", endpoint="/boom", status="500", error_type="internal") == 1


def test_a_text_log_line_says_what_the_json_line_says():
    from service.logs import JsonFormatter, TextFormatter

    fields = {"request_id": "r-1", "method": "POST", "route": "/v1/embed", "path": "/v1/embed", "model": "m",
              "status": 200, "error_type": None, "inputs": 2, "tokens": 17, "tokenize_ms": 0.1, "queue_ms": 0.2,
              "inference_ms": 1.5, "total_ms": 2.25, "client": "10.0.0.1:5000"}  # fmt: skip
    record = logging.LogRecord("bigs.access", logging.INFO, __file__, 1, '%s - "%s %s" %d', None, None)
    record.args = ("10.0.0.1:5000", "POST", "/v1/embed", 200)
    record.fields = fields
    text = TextFormatter().format(record)
    assert text == (
        'INFO:     10.0.0.1:5000 - "POST /v1/embed" 200 request_id=r-1 route=/v1/embed model=m inputs=2 tokens=17 '
        "tokenize_ms=0.1 queue_ms=0.2 inference_ms=1.5 total_ms=2.25"
    )
    line = json.loads(JsonFormatter().format(record))
    assert {k: line[k] for k in fields} == fields and line["message"] == '10.0.0.1:5000 - "POST /v1/embed" 200'


# -- request ids --------------------------------------------------------------------------------


def test_a_client_request_id_is_echoed_on_answers_and_errors(client):
    for method, path, body in [
        ("POST", "/v1/classify", {"inputs": "the cat sat"}),
        ("POST", "/v1/classify", {"inputs": ""}),  # 422
        ("GET", "/v1/nothing", None),  # 404
        ("GET", "/health", None),
    ]:
        given = f"trace-{path.strip('/').replace('/', '.')}-0f3a:1"
        response = client.request(method, path, json=body, headers={"X-Request-ID": given})
        assert response.headers["x-request-id"] == given, (path, response.status_code, response.headers)


def test_a_missing_or_unacceptable_request_id_is_replaced_by_a_generated_one(client):
    ids = set()
    for headers in [{}, {}, {"X-Request-ID": "x" * 129}, {"X-Request-ID": "two words"}, {"X-Request-ID": ""},
                    {"X-Request-ID": "naïve".encode()}]:  # fmt: skip
        response = client.post("/v1/classify", json={"inputs": "a dog"}, headers=headers)
        assert response.status_code == 200, response.text  # replaced, never refused
        assert GENERATED_ID.fullmatch(response.headers["x-request-id"]), response.headers
        ids.add(response.headers["x-request-id"])
    assert len(ids) == 6
    bad = client.post("/v1/classify", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 422 and GENERATED_ID.fullmatch(bad.headers["x-request-id"])


# -- logs ---------------------------------------------------------------------------------------


def test_one_json_log_line_per_request_with_its_fields(observed, client):
    ok_id, error_id = "log-ok-1", "log-too-long-1"
    lengths = [7, 20]
    ok = client.post("/v1/classify", json={"inputs": [text_of(n) for n in lengths]}, headers={"X-Request-ID": ok_id})
    too_long = client.post("/v1/classify", json={"inputs": text_of(600)}, headers={"X-Request-ID": error_id})
    assert (ok.status_code, too_long.status_code) == (200, 413)

    (line,) = log_lines(observed, ok_id)  # exactly one: uvicorn's own access log is off
    assert line["logger"] == "bigs.access" and line["level"] == "info"
    assert line["request_id"] == ok_id
    assert (line["method"], line["route"], line["path"]) == ("POST", "/v1/classify", "/v1/classify")
    assert (line["model"], line["status"], line["error_type"]) == ("cls", 200, None)
    assert (line["inputs"], line["tokens"]) == (2, sum(lengths))
    for key in ("tokenize_ms", "queue_ms", "inference_ms", "total_ms"):
        assert isinstance(line[key], float) and line[key] >= 0, (key, line)
    assert line["total_ms"] >= line["inference_ms"] > 0
    assert line["inference_ms"] == pytest.approx(float(ok.headers["x-inference-time"]), abs=0.01)
    assert line["client"].startswith(f"{HOST}:")
    assert re.fullmatch(r"[0-9a-f]{32}", line["trace_id"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])

    (failed,) = log_lines(observed, error_id)
    assert (failed["status"], failed["error_type"], failed["model"]) == (413, "too_long", "cls")
    assert failed["queue_ms"] is None and failed["inference_ms"] is None  # it never reached a queue


def test_every_line_the_server_writes_is_json(observed, client):
    assert client.get("/health").status_code == 200
    lines = observed.log_path.read_text().splitlines()
    assert any('"Application startup complete."' in line for line in lines)  # uvicorn's lines too
    for line in lines:
        assert isinstance(json.loads(line), dict), line


def test_start_up_probes_are_logged_at_info_not_as_warnings_and_the_ready_line_is_written_once(observed):
    """The fixture's start-up polled /ready every 50 ms until 200, as a Kubernetes probe does every few seconds."""
    lines = [json.loads(line) for line in observed.log_path.read_text().splitlines()]
    probes = [line for line in lines if line.get("path") == "/ready"]
    assert any(line["status"] == 503 for line in probes), "no /ready poll before ready was logged"
    assert {line["level"] for line in probes} == {"info"}, [line for line in probes if line["level"] != "info"]
    assert [line["message"] for line in lines if line["message"].startswith("ready at ")] == [
        next(line["message"] for line in lines if line["message"].startswith("ready at "))
    ]


def test_probe_lines_can_be_turned_off_and_another_routes_503_stays_a_warning(caplog):
    """In process, before ready (the app's lifespan, which loads the models, is not entered)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    def access_lines(**settings) -> list[logging.LogRecord]:
        caplog.clear()
        client = TestClient(create_app(ServiceSettings(models=[], **settings)))
        with caplog.at_level(logging.INFO, logger="bigs.access"):
            assert client.get("/ready").status_code == 503 and client.get("/health").status_code == 200
            assert client.post("/v1/classify", json={"inputs": "a"}).status_code == 503
        return [r for r in caplog.records if r.name == "bigs.access"]

    logged = access_lines()
    assert [(r.fields["path"], r.fields["status"], r.levelname) for r in logged] == [
        ("/ready", 503, "INFO"),
        ("/health", 200, "INFO"),
        ("/v1/classify", 503, "WARNING"),
    ]
    quiet = access_lines(access_log_probes=False)
    assert [(r.fields["path"], r.levelname) for r in quiet] == [("/v1/classify", "WARNING")]


# -- tracing ------------------------------------------------------------------------------------


def test_the_receiver_gets_a_span_per_request_with_its_stages_in_the_callers_trace(observed, client, receiver):
    trace_id, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    lengths = [10, 200]  # two buckets: 128 and 512, so two batches
    response = client.post(
        "/v1/classify",
        json={"inputs": [text_of(n) for n in lengths]},
        headers={"traceparent": f"00-{trace_id}-{caller_span}-01", "X-Request-ID": "traced-1"},
    )
    assert response.status_code == 200
    spans = receiver.trace(trace_id, spans=6)
    (request,) = [s for s in spans if s["name"] == "POST /v1/classify"]
    assert request["parent_span_id"] == caller_span
    assert request["kind"] == 2  # SPAN_KIND_SERVER
    attributes = request["attributes"]
    assert attributes["bigs.request_id"] == "traced-1"
    assert (attributes["bigs.model"], attributes["bigs.inputs"], attributes["bigs.tokens"]) == ("cls", 2, 210)
    assert (attributes["http.route"], attributes["http.response.status_code"]) == ("/v1/classify", 200)
    assert request["resource"]["service.name"] == "bigs-test"

    children = [s for s in spans if s is not request]
    assert sorted(s["name"] for s in children) == ["inference", "inference", "queue", "queue", "tokenize"]
    for child in children:
        assert child["parent_span_id"] == request["span_id"], child
        assert request["start"] <= child["start"] <= child["end"] <= request["end"], child
        assert child["attributes"]["bigs.model"] == "cls"
    (tokenize,) = [s for s in children if s["name"] == "tokenize"]
    assert tokenize["attributes"]["bigs.tokens"] == 210
    inference = sorted((s for s in children if s["name"] == "inference"), key=lambda s: s["attributes"]["bigs.bucket"])
    assert [s["attributes"]["bigs.bucket"] for s in inference] == [128, 512]
    assert [s["attributes"]["bigs.tokens"] for s in inference] == lengths
    assert all(s["attributes"]["bigs.batch_size"] >= 1 for s in inference)
    assert tokenize["end"] <= min(s["start"] for s in children if s["name"] == "queue")

    (line,) = log_lines(observed, "traced-1")
    assert line["trace_id"] == trace_id  # the log line names the trace


@pytest.mark.parametrize(
    "environ, on",
    [
        ({}, False),  # nothing configured: nothing changes
        ({"OTEL_SERVICE_NAME": "x"}, False),  # a name alone configures no exporter
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, False),  # not supported: a warning, no tracing
    ],
)
def test_tracing_is_on_exactly_when_the_standard_variables_configure_an_exporter(environ, on):
    from service.telemetry import tracing_from_environment

    tracing = tracing_from_environment("0", environ)
    assert (tracing is not None) == on
    if tracing is not None:
        tracing.shutdown()
