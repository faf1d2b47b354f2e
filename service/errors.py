"""Errors as JSON `{"error", "error_type"}` with honest status codes (TEI's shape, kept exact: the
request's id is in the `X-Request-ID` header of every answer, not in the body).

422 malformed input · 413 too long without truncate, or body too large · 400 unknown model ·
401 missing/wrong API key · 429 overloaded (Retry-After) · 503 not ready · 504 deadline passed ·
500 only for a failure of the runtime itself, never for something a user sent.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .telemetry import note_error


class ServiceError(Exception):
    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


def error_response(status: int, error_type: str, message: str, headers: dict | None = None) -> JSONResponse:
    """The JSON error; its `error_type` is noted on the request's record (metrics, log line, trace)."""
    note_error(error_type)
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


def _describe_validation(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors():
        if item.get("type") == "json_invalid":
            return "the body is not valid JSON"
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {item.get('msg', 'invalid')}")
    return "; ".join(parts[:5]) or "invalid request"


def install_handlers(app) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, error: ServiceError):
        return error_response(error.status, error.error_type, error.message, error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in content_type:
            message = f"send the body as JSON with Content-Type: application/json (got {content_type or 'none'!r})"
            return error_response(415, "unsupported_media_type", message)
        return error_response(422, "validation", _describe_validation(error))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        kinds = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        return error_response(error.status_code, kinds.get(error.status_code, "http"), str(error.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception):
        return error_response(500, "internal", f"{type(error).__name__}: {error}")
