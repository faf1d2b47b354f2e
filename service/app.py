"""The FastAPI application: `create_app(settings)`, its lifespan and its ASGI middleware.

Start-up loads every export dir (service/state.py: manifest read once, hashes checked, one engine
per model, every batch shape warmed up) and only then answers ready. Loading runs in the background
so /health and /ready answer meanwhile. Shutdown (SIGTERM through uvicorn) closes admission, lets
in-flight requests finish, then drains the queues.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from .errors import error_response, install_handlers
from .metrics import ServiceMetrics
from .routes import api, ops
from .settings import ServiceSettings
from .state import ServiceState


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings or ServiceSettings()
    state = ServiceState(settings)

    async def load_then_ready():
        try:
            await asyncio.to_thread(state.load)
            state.start()
        except Exception as error:  # reported by /ready; the process stays up to say why
            state.load_error = f"{type(error).__name__}: {error}"
            print(f"model loading failed: {state.load_error}")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = asyncio.create_task(load_then_ready())
        yield
        state.stopping = True  # a load still under way ends without opening admission
        await loading
        await state.stop()

    app = FastAPI(
        title="BiGS serving",
        version="0.1.0",
        description="Fill-mask, classification, long-document classification and embeddings with BiGS, "
        "the attention-free bidirectional gated SSM encoder.",
        lifespan=lifespan,
    )
    app.state.service = state
    install_handlers(app)
    app.include_router(ops)
    app.include_router(api)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])  # fmt: skip

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(Measure, metrics=state.metrics)  # outermost: counts every answer, 413s included
    return app


class Measure:
    """Request count and latency per endpoint and status.

    Plain ASGI, not `@app.middleware("http")`: that wraps `receive` in a way that hides the client's
    disconnect from `Request.is_disconnected()`, so queued work of a client that left was computed anyway."""

    def __init__(self, app, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500  # unless a response starts

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            endpoint = route.path if route is not None else "unmatched"
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.request_latency.labels(endpoint, str(status)).observe(time.perf_counter() - started)


class BodyLimit:
    """Refuse bodies over the limit, by Content-Length or, when sent without one (chunked), by the bytes.

    The body is read here, up to the limit, before the app sees it, then handed on in one piece:
    an exception raised from inside the app's `receive` would reach FastAPI's body parser and come
    out as a 400, not a 413."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = error_response(413, "body_too_large", f"request body over {self.max_bytes} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await too_large(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body was in
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                return await too_large(scope, receive, send)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # afterwards: http.disconnect, when the client goes

        await self.app(scope, replay, send)
