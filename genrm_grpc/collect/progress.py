"""The one-line progress display of a collect run (stderr)."""

from __future__ import annotations

import asyncio
import time
from typing import IO


class Progress:
    """Groups done / failed / in flight and the rate, on one stderr line.

    While ``status`` is set (e.g. "connecting to HOST:PORT…") the line shows it instead
    of the counters. On a terminal :meth:`tick` keeps the elapsed time moving.
    """

    def __init__(self, total: int, enabled: bool | None, stream: IO[str]) -> None:
        self.total, self.stream = total, stream
        self.tty = stream.isatty()
        self.enabled = enabled if enabled is not None else True
        self.done = self.failed = self.in_flight = 0
        self._shown = 0
        self.status: str | None = None
        self.started = time.monotonic()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        if self.status is not None:
            return f"{self.status}  {elapsed:.1f}s"
        finished = self.done + self.failed
        return (
            f"groups {finished}/{self.total}  ok {self.done}  failed {self.failed}  "
            f"in flight {self.in_flight}  {finished / elapsed:.2f} groups/s  {elapsed:.1f}s"
        )

    def set_status(self, status: str | None) -> None:
        """Show ``status`` (one line on a pipe) or, with None, the counters again."""
        self.status = status
        if not self.enabled:
            return
        if self.tty:
            self.show()
        elif status is not None:
            self.stream.write(status + "\n")
            self.stream.flush()

    def show(self) -> None:
        """TTY: rewrite the line in place; otherwise one line per finished group."""
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
        elif self.done + self.failed != self._shown:
            self._shown = self.done + self.failed
            self.stream.write(self.line() + "\n")
        else:
            return
        self.stream.flush()

    async def tick(self, every_s: float = 1.0) -> None:
        """On a terminal, redraw the line every ``every_s`` until cancelled."""
        if not (self.enabled and self.tty):
            return
        while True:
            await asyncio.sleep(every_s)
            self.show()

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
