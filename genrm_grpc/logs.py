"""Structured logs: one JSON object per line (or plain text for humans).

Either way one record is exactly one line: ids and reasons come from clients, and a
group_id holding a newline or an ANSI escape must not forge a log line or recolour a
terminal. JSON escapes control characters by itself; the text format escapes them
(``\\n``, ``\\x1b``, ``\\u2028``) in the message, in the extra fields it appends as
``key=value``, and in exception text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}

# C0 and C1 controls, DEL, and the Unicode line/paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as a visible escape."""
    return _CONTROL.sub(_escape_one, text)


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


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


def _logfmt_value(value: object) -> str:
    """A bare word when that is unambiguous, else a quoted string; controls escaped."""
    text = escape(value if isinstance(value, str) else json.dumps(value, default=str))
    if text and not any(c.isspace() or c in '"=\\' for c in text):
        return text
    return '"' + text.replace('"', '\\"') + '"'


class TextFormatter(logging.Formatter):
    """One line for humans that keeps every structured field as ``key=value``.

    ``2026-01-02T03:04:05.678Z WARNING genrm_grpc.runtime.engine: cohort failed
    cohort=g:job-42#0 group_size=8 outcome=failed reason="collection deadline expired …"``
    """

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.name}: "
        line += escape(record.getMessage())
        fields = " ".join(f"{k}={_logfmt_value(v)}" for k, v in _extras(record).items())
        if fields:
            line += " " + fields
        if record.exc_info:
            line += " exc=" + _logfmt_value(self.formatException(record.exc_info))
        return line


def configure(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
