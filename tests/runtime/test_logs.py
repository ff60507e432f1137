"""Client-controlled text never forges log lines: one record is one line in both formats."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from genrm_grpc import logs

HOSTILE = "g\n2026-12-02 10:00:00,000 INFO genrm_grpc: fake\r\x1b[31mred\u2028more\x00\x85"


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Logger]]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    stream = io.StringIO()
    try:
        yield stream, logging.getLogger("genrm_grpc.test_logs")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]


def _configure(fmt: str, stream: io.StringIO) -> None:
    logs.configure("INFO", fmt)
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_ids_with_control_characters_stay_on_one_escaped_line(
    captured: tuple[io.StringIO, logging.Logger], fmt: str
) -> None:
    stream, log = captured
    _configure(fmt, stream)
    log.warning("cohort %s failed", HOSTILE, extra={"cohort": HOSTILE, "reason": HOSTILE})
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        log.exception("evaluation of cohort %s failed", HOSTILE)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    text = stream.getvalue()
    for char in ("\r", "\x1b", "\u2028", "\x00", "\x85"):
        assert char not in text
    if fmt == "text":
        assert "g\\n2026-12-02" in lines[0] and "\\x1b[31mred\\u2028more\\x00\\x85" in lines[0]
        # Values with spaces are quoted (logfmt), escapes stay visible inside the quotes.
        assert 'cohort="g\\n2026' in lines[0]
        assert 'exc="Traceback' in lines[1] and "ValueError: g\\n2026" in lines[1]
    else:
        assert json.loads(lines[0])["cohort"] == HOSTILE
        assert HOSTILE in json.loads(lines[1])["exc"]
