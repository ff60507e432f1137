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
from collections import OrderedDict
from collections.abc import Callable

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


class RepeatCollapser(logging.Filter):
    """One record per kind and interval; the rest are counted and reported with the next.

    asyncio's accept loop logs "socket.accept() out of system resource" each time it
    meets EMFILE, for each listener, and retries a second later: out of descriptors, a
    server logged thousands of such records in half a minute. The first record of a kind
    (logger, level, message template) passes; repeats within ``interval_s`` are dropped
    and counted, and the first record after the interval says how many were dropped.
    At most ``max_kinds`` kinds are tracked (the oldest forgotten first).
    """

    def __init__(
        self,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_kinds: int = 256,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._max_kinds = max_kinds
        self._kinds: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        window = self._kinds.get(key)  # [start, dropped]
        if window is not None and now - window[0] < self.interval_s:
            window[1] += 1
            return False
        dropped = int(window[1]) if window is not None else 0
        self._kinds[key] = [now, 0]
        self._kinds.move_to_end(key)
        while len(self._kinds) > self._max_kinds:
            self._kinds.popitem(last=False)
        if dropped:
            record.msg = (
                f"{record.getMessage()} (and {dropped} more like it in the last "
                f"{self.interval_s:g} s, not logged)"
            )
            record.args = ()
        return True


def configure(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # asyncio's own records (accept loops out of descriptors, above all) never flood.
    aio = logging.getLogger("asyncio")
    for old in [f for f in aio.filters if isinstance(f, RepeatCollapser)]:
        aio.removeFilter(old)
    aio.addFilter(RepeatCollapser())
