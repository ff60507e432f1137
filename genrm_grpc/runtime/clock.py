"""Time for the runtime: the event loop's monotonic clock.

Tests drive time by hand with ``genrm_grpc.testing.ManualClock``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle: ...


class LoopClock:
    """The running loop's monotonic clock (``loop.time()`` / ``loop.call_at``)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_at(when, callback)


class WallClock:
    """Wall-clock seconds (``time.time()``): what replicas sharing a store compare.

    Deadlines written by one replica are read by another, so the replicas' runtimes
    count in the time they all share (kept in step by NTP), not in a process's own
    monotonic clock.
    """

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)
