"""Structured logs: one JSON object per line (or plain text for humans)."""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
    }


def _logfmt_value(value: object) -> str:
    """A bare word when that is unambiguous, else a JSON string (quotes, escapes)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c.isspace() or c in '"=\\' for c in text):
        return text
    return json.dumps(text, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """One line for humans that keeps every structured field as ``key=value``.

    ``2026-01-02T03:04:05.678Z WARNING genrm_grpc.runtime.engine: cohort failed
    cohort=g:job-42#0 group_size=8 outcome=failed reason="collection deadline expired …"``
    """

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.name}: "
        line += record.getMessage()
        fields = " ".join(f"{k}={_logfmt_value(v)}" for k, v in _extras(record).items())
        if fields:
            line += " " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
