"""The FastAPI application: `create_app(settings)`, its lifespan and its ASGI middleware.

Start-up loads every export dir (service/state.py: manifest read once, hashes checked, one engine
per model, every batch shape warmed up) and only then answers ready. Loading runs in the background
so /health and /ready answer meanwhile. A model that fails to load calls `on_fatal` with one line
saying which and why (`bigs serve` then exits non-zero: service/server.py), unless
`skip_failed_models`. Shutdown (SIGTERM through uvicorn) closes admission, lets in-flight requests
finish, then drains the queues.

Middleware, outermost first: Observe (request id, metrics, log line, trace: service/telemetry.py) →
CORS → ApiKey → BodyLimit → Admit → the routes; so every answer has its id and log line, a request
without the key costs no body read, one refused under overload (429) no JSON parse, and a 401, 413
or 429 carries CORS headers.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline
from starlette.routing import Match

from .admission import Admission
from .errors import ServiceError, error_response, install_handlers
from .routes import VERSION, api, ops, tei
from .settings import ServiceSettings
from .state import LoadFailed, ServiceState, one_line
from .telemetry import REQUEST_ID_HEADER, Telemetry, log, tracing_from_environment

DESCRIPTION = """Fill-mask, classification, long-document classification and embeddings with BiGS, the
attention-free bidirectional gated SSM encoder.

Three wire formats: the Hugging Face Inference API's under `/v1/` (fill-mask, classify, embed),
OpenAI's `POST /v1/embeddings` and `GET /v1/models`, and text-embeddings-inference's `/embed`,
`/predict`, `/rerank`, `/tokenize`, `/decode`, `/info` and `POST /`. With `BIGS_API_KEY` set, every
route but /health and /ready needs `Authorization: Bearer <key>`."""


def create_app(
    settings: ServiceSettings | None = None,
    on_fatal: Callable[[str], None] | None = None,
    started: float | None = None,
) -> FastAPI:
    """The app. `on_fatal(line)`: called when the models cannot be served (one line: which model
    failed and why); without it the line is logged and the process stays up, /ready saying why.
    `started`: when the process started (time.perf_counter), what the ready line's time counts from."""
    settings = settings or ServiceSettings()
    state = ServiceState(settings, started)
    telemetry = Telemetry(
        state.metrics, settings.access_log, tracing_from_environment(VERSION), log_probes=settings.access_log_probes
    )

    async def load_then_ready():
        try:
            await asyncio.to_thread(state.load)
            state.start()
            if state.ready:  # the user's first sign that requests are answered now: where, what, how soon
                for line in state.ready_lines():
                    log.info(line)
                state.after_ready()
        except Exception as error:
            state.load_error = error.public if isinstance(error, LoadFailed) else "model loading failed"
            line = str(error) if isinstance(error, LoadFailed) else f"model loading failed: {one_line(error)}"
            if on_fatal is not None:
                on_fatal(line)
            else:
                log.error(line)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = asyncio.create_task(load_then_ready())
        yield
        state.stopping = True  # a load still under way ends without opening admission
        await loading
        await state.stop()
        if telemetry.tracing is not None:
            await asyncio.to_thread(telemetry.tracing.shutdown)  # export the last spans

    # /docs (Swagger UI) and /redoc load their scripts and styles from the service itself
    # (/static-offline-docs, the assets packaged in fastapi-offline), never from a CDN: they work offline.
    app: FastAPI = FastAPIOffline(
        title="BiGS serving",
        version=VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.service = state
    install_handlers(app)
    app.include_router(ops)
    app.include_router(api)
    app.include_router(tei)
    # add_middleware puts each one outside those added before it
    app.add_middleware(Admit, admission=state.admission, router=app.router)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    if settings.api_key:
        app.add_middleware(ApiKey, key=settings.api_key, open_paths=settings.open_paths)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                           expose_headers=["X-Request-ID", "X-Queue-Time", "X-Inference-Time", "X-Total-Time",
                                           "X-Compute-Tokens"])  # fmt: skip
    # Outermost: every answer has its id, metrics and log line, 401s, 413s and 429s included. `routes`: the
    # service's routes, each with its whole path (the app's router holds the included routers, not them).
    app.add_middleware(Observe, telemetry=telemetry, routes=[*ops.routes, *api.routes, *tei.routes])
    document_security(app, settings)
    return app


UNAUTHORIZED = {
    "description": "missing or wrong API key",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
}


def document_security(app: FastAPI, settings: ServiceSettings) -> None:
    """The OpenAPI document states the deployment's contract: the bearer scheme, and its 401, on
    every operation the ApiKey middleware guards, none on `open_paths`, and no scheme at all when no
    key is set (the routes declare it unconditionally; this settles it once, when the document is
    first built)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = build()
            for path, operations in document["paths"].items():
                for operation in operations.values():
                    if not settings.api_key or path in settings.open_paths:
                        operation.pop("security", None)
                    else:
                        operation["security"] = [{"HTTPBearer": []}]
                        operation["responses"].setdefault("401", UNAUTHORIZED)
            if not settings.api_key:
                document.get("components", {}).pop("securitySchemes", None)
        return app.openapi_schema

    app.openapi = openapi


class Observe:
    """Every request's telemetry (service/telemetry.py): its id, echoed as `X-Request-ID` on every
    response, errors included; its record, made current for the stages to write; and, once it is
    answered, its metrics, log line and trace. An exception no handler answered becomes a JSON 500
    here, with the id, and is logged with its traceback (not left to the server's default page).

    Plain ASGI, not `@app.middleware("http")`: that wraps `receive` in a way that hides the client's
    disconnect from `Request.is_disconnected()`, so queued work of a client that left was computed anyway."""

    def __init__(self, app, telemetry: Telemetry, routes: list):
        self.app, self.telemetry, self.routes = app, telemetry, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        record, token = self.telemetry.start(scope)
        request_id = (REQUEST_ID_HEADER, record.id.encode("ascii"))
        started = False

        async def send_with_id(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                record.status = message["status"]
                message["headers"] = [*message.get("headers", ()), request_id]
            await send(message)

        error = None
        try:
            await self.app(scope, receive, send_with_id)
        except Exception as raised:
            if started:  # the answer is under way: nothing else can be sent
                raise
            error = raised
            await error_response(500, "internal", f"{type(raised).__name__}: {raised}")(scope, receive, send_with_id)
        finally:
            if "route" not in scope:  # answered before routing (401, 408, 413, 429, 503): whose route it was
                scope["route"] = self._route(scope)
            self.telemetry.finish(record, token, scope, error)

    def _route(self, scope):
        """The route that takes this path and method, or None (the routes' own test; errors only)."""
        for route in self.routes:
            if route.matches(scope)[0] == Match.FULL:
                return route
        return None


class ApiKey:
    """With an API key set, every path but `open_paths` needs `Authorization: Bearer <key>` (the
    scheme in any case); else 401 with `WWW-Authenticate: Bearer`. Checked before the body is read,
    compared in constant time."""

    def __init__(self, app, key: str, open_paths: list[str]):
        self.app, self.key, self.open_paths = app, key.encode(), frozenset(open_paths)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._preflight(scope):
            return await self.app(scope, receive, send)
        scheme, _, credentials = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.key):
            return await self.app(scope, receive, send)
        message = "missing or wrong API key (Authorization: Bearer <key>)"
        await error_response(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})(scope, receive, send)

    @staticmethod
    def _preflight(scope) -> bool:
        """A CORS preflight (no credentials by design); CORSMiddleware, outside, answers it when on."""
        return scope["method"] == "OPTIONS" and b"access-control-request-method" in dict(scope["headers"])


class BodyLimit:
    """Refuse bodies over the limit, by Content-Length or, when sent without one (chunked), by the
    bytes (413), or that take over `timeout_s` to arrive (408, and the connection is closed).

    The body is read here, up to the limit, before the app sees it, then handed on in one piece:
    an exception raised from inside the app's `receive` would reach FastAPI's body parser and come
    out as a 400, not a 413."""

    def __init__(self, app, max_bytes: int, timeout_s: float | None = None):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        def too_large():  # built only when it is the answer (building it notes the error on the request)
            return error_response(413, "body_too_large", f"request body over {self.max_bytes} bytes")

        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await too_large()(scope, receive, send)
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            message = f"the request body did not arrive within {self.timeout_s:g} s"
            return await error_response(408, "body_timeout", message, {"Connection": "close"})(scope, receive, send)
        if body is None:  # the client left before its body was in
            return
        if len(body) > self.max_bytes:
            return await too_large()(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # afterwards: http.disconnect, when the client goes

        await self.app(scope, replay, send)

    async def _read(self, receive) -> bytearray | None:
        """The body, or as much of it as is one byte over the limit; None when the client left."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_bytes or not message.get("more_body", False):
                return body


class Admit:
    """A request permit (service/admission.py) for every inference request (a POST that a route
    takes: every POST route is one), once its body is in and before it is parsed: under overload,
    429 costs no JSON parse; before ready or while stopping, 503. Released once the response has
    been sent. A POST no route takes goes on to its 404 or 405 unadmitted."""

    def __init__(self, app, admission: Admission, router):
        self.app, self.admission, self.router = app, admission, router

    def _inference(self, scope) -> bool:
        # the router's own test (path and method), asked before routing: a few dozen comparisons
        return scope["method"] == "POST" and any(route.matches(scope)[0] == Match.FULL for route in self.router.routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._inference(scope):
            return await self.app(scope, receive, send)
        try:
            self.admission.enter()
        except ServiceError as refused:
            response = error_response(refused.status, refused.error_type, refused.message, refused.headers)
            return await response(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave()
