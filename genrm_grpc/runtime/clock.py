"""Time for the runtime: a :class:`Clock` (the protocol, ``genrm_grpc.cohort.clock``).

The single process counts in the event loop's monotonic clock (:class:`LoopClock`); the
replicas' runtime in wall-clock seconds (:class:`WallClock`, ``genrm_grpc.store.clock``).
Tests drive time by hand with ``genrm_grpc.testing.ManualClock``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from genrm_grpc.cohort.clock import Clock, TimerHandle
from genrm_grpc.store.clock import WallClock

__all__ = ["Clock", "LoopClock", "TimerHandle", "WallClock", "sleep"]


class LoopClock:
    """The running loop's monotonic clock (``loop.time()`` / ``loop.call_at``)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_at(when, callback)


async def sleep(clock: Clock, seconds: float) -> None:
    """Wait ``seconds`` of ``clock``'s time (a ManualClock: until a test advances it)."""
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    timer = clock.call_at(clock.now() + seconds, wake)
    try:
        await woken
    finally:
        timer.cancel()
