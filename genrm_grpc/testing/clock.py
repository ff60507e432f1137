"""A manual clock for deterministic tests of deadlines and timers (a TEST DOUBLE).

It satisfies the runtime's ``Clock`` protocol; time moves only when the test says so.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from genrm_grpc.cohort.clock import TimerHandle

__all__ = ["ManualClock"]


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance` (timers fire in order)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _ManualHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        handle = _ManualHandle()
        heapq.heappush(self._timers, (when, next(self._seq), handle, callback))
        return handle

    def set(self, when: float) -> None:
        """Move time to ``when`` without firing timers (to stage a timer that runs late)."""
        self._now = when

    def advance(self, seconds: float) -> None:
        """Move time forward and run every timer that is now due, earliest first."""
        self._now += seconds
        self.fire_due()

    def fire_due(self) -> None:
        while self._timers and self._timers[0][0] <= self._now:
            _, _, handle, callback = heapq.heappop(self._timers)
            if not handle.cancelled:
                callback()

    def pending(self) -> int:
        return sum(1 for t in self._timers if not t[2].cancelled)
