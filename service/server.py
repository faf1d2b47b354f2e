"""`serve(settings)`: the app under uvicorn, with the transport limits and the shutdown of the settings.

uvicorn as configured by `uvicorn.run` has no bound on a request's header size (its default
parser, httptools, takes a 256 MB header), on the time to send the headers, on open connections,
or on the drain after SIGTERM. Here:

- HTTP is parsed by h11 (`ServiceHTTP`, a subclass of uvicorn's h11 protocol), which bounds an
  incomplete request head: past `max_header_bytes`, 431 and the connection is closed. The 400s
  of malformed requests are JSON too.
- A request line and headers must arrive within `header_timeout_s` of the connection (or of the
  previous response); else the connection is closed (slow senders). The body's time is bounded by
  the BodyLimit middleware (`body_timeout_s`, 408; service/app.py).
- Past `max_connections` open connections, a new connection's request is answered 503 and the
  connection closed.
- Idle keep-alive connections close after `keep_alive_timeout_s`; no `server` header.
- SIGTERM: admission closes at once (/ready 503), the requests in flight finish; after
  `drain_timeout_s` whatever is still queued or running is answered 503 (ServiceState.expire_drain)
  and the process exits. A batch already on the runtime finishes on its thread first.
- A model that fails to load ends the process: exit status 1, its last line saying which and why.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .app import create_app
from .logs import configure as configure_logging
from .settings import ServiceSettings

GRACE_AFTER_DRAIN_S = 5.0  # uvicorn cancels handlers still running this long after drain_timeout_s


class ServiceHTTP(H11Protocol):
    """uvicorn's h11 protocol with a bound on open connections, a time limit on request heads and
    JSON error bodies. `configured(settings)` gives the class uvicorn instantiates per connection."""

    max_connections: int = 1024
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024

    @classmethod
    def configured(cls, settings: ServiceSettings) -> type[ServiceHTTP]:
        limits = {
            "max_connections": settings.max_connections,
            "header_timeout_s": settings.header_timeout_s,
            "max_header_bytes": settings.max_header_bytes,
        }
        return type("ServiceHTTP", (cls,), limits)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            self.app = over_capacity  # this connection's request is answered 503, then it is closed
        self._await_head()

    def connection_lost(self, exc) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head arrived: its body is BodyLimit's business
            self._head_arrived()

    def on_response_complete(self) -> None:
        self._await_head()  # the next request's head (before super: it may start a pipelined one)
        super().on_response_complete()

    def _await_head(self) -> None:
        self._head_arrived()
        self.head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _head_arrived(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_too_slow(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of a head came
            message = f"the request line and headers did not arrive within {self.header_timeout_s:g} s"
            self._send_error(408, "header_timeout", message)
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse: 431 when its head is over the limit, else 400; JSON, then close."""
        if len(self.conn.trailing_data[0]) > self.max_header_bytes:
            self._send_error(431, "headers_too_large", f"request line and headers over {self.max_header_bytes} bytes")
        else:
            self._send_error(400, "bad_request", "invalid HTTP request")

    def _send_error(self, status: int, error_type: str, message: str) -> None:
        body = json.dumps({"error": message, "error_type": error_type}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]  # fmt: skip
        try:
            head = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode())
            for event in (head, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # no response can be sent in this state: just close
            pass
        self.transport.close()


async def over_capacity(scope, receive, send) -> None:
    body = json.dumps({"error": "too many open connections; retry shortly", "error_type": "overloaded"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"retry-after", b"1"), (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ServiceServer(uvicorn.Server):
    """uvicorn's server, telling the app when a shutdown begins (before it waits for connections)."""

    def __init__(self, config: uvicorn.Config, on_shutdown):
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets=None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)


def serve(settings: ServiceSettings, started: float | None = None) -> str | None:
    """Serve until SIGTERM/SIGINT (None) or until the models cannot be served (the line saying why).
    `started`: when the process started (time.perf_counter), what the ready line's time counts from."""
    fatal: list[str] = []

    def on_fatal(line: str) -> None:
        fatal.append(line)
        server.should_exit = True

    configure_logging(settings.log_format)  # first: the app's start-up warnings are formatted too
    app = create_app(settings, on_fatal=on_fatal, started=started)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # configured above (service/logs.py)
        log_level="info",
        http=ServiceHTTP.configured(settings),
        h11_max_incomplete_event_size=settings.max_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        timeout_graceful_shutdown=settings.drain_timeout_s + GRACE_AFTER_DRAIN_S,
        server_header=False,
        access_log=False,  # the app's own line per request replaces it (bigs.access: service/telemetry.py)
    )
    server = ServiceServer(config, on_shutdown=app.state.service.begin_drain)
    try:
        server.run()
    except SystemExit:  # a signal's exit (bigs_cli's SIGTERM handler) during a failed start-up: report the failure
        if not fatal:
            raise
    return fatal[0] if fatal else None
