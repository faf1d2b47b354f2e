"""Logging of `bigs serve`: every line through stdlib `logging`, as text or as one JSON object per line
(`log_format`, BIGS_LOG_FORMAT).

Loggers: `bigs.access` (one line per request, written by service/telemetry.py; stdout), `bigs` (the
service's own warnings; stderr) and uvicorn's (`uvicorn.error`: start-up, shutdown, protocol errors;
stderr). uvicorn's own access log is off: the `bigs.access` line replaces it, with the request id,
model, tokens and timings, so a request is never logged twice.

A JSON line is `{"time", "level", "logger", "message", …}`: ISO 8601 UTC time with milliseconds (…Z), the
level in lower case, and for a request line its fields (docs/DESIGN.md §4.10) at the top level, so
a log pipeline (Loki, Elasticsearch, Cloud Logging) can index them without parsing the message.
"""

from __future__ import annotations

import json
import logging
import logging.config
import time
from typing import Literal

LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    """One JSON object per record; a request line's `fields` (a dict in `extra`) at its top level."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(record.created))}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


IN_MESSAGE = {"client", "method", "path", "status"}  # a request line's message says these already
ZERO_UNSAID = {"inputs", "tokens"}  # 0 for a request that ran no model (/health, most errors): left out


class TextFormatter(logging.Formatter):
    """`LEVEL: message` and, for a request line, its fields as `key=value` (the ones that are set)."""

    def __init__(self):
        super().__init__("%(levelname)s:     %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            shown = (
                f"{k}={v}"
                for k, v in fields.items()
                if v is not None and k not in IN_MESSAGE and (v or k not in ZERO_UNSAID)
            )
            text += " " + " ".join(shown)
        return text


def configure(log_format: LogFormat) -> None:
    """Route the service's and uvicorn's loggers through one formatter (before uvicorn starts; uvicorn
    is then given no log config of its own)."""
    formatter = {"()": JsonFormatter} if log_format == "json" else {"()": TextFormatter}
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"line": formatter},
            "handlers": {
                "stdout": {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stdout"},
                "stderr": {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"},
            },
            "loggers": {
                "bigs": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
                "bigs.access": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
                "uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
                "uvicorn.error": {"level": "INFO"},
                "uvicorn.access": {"handlers": [], "level": "INFO", "propagate": False},
            },
        }
    )
