"""A priority-ordered bound on in-flight judge requests.

``judge_max_concurrency`` permits are handed out lowest priority value first, so the
pairs of the cohort that became ready first are judged first and, under load,
cohorts finish one after another instead of all finishing late. A waiter that is
cancelled leaves the queue; a permit granted to a waiter that was cancelled at the
same moment is passed on, never lost.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class PrioritySemaphore:
    def __init__(self, permits: int) -> None:
        if permits < 1:
            raise ValueError("permits must be >= 1")
        self._free = permits
        self._capacity = permits
        self._queue: list[tuple[tuple[int, ...], int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def in_use(self) -> int:
        return self._capacity - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._queue if not f.done())

    async def acquire(self, priority: tuple[int, ...]) -> None:
        # Permits are free only while nobody waits: release() hands them to waiters first.
        if self._free > 0:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (priority, next(self._seq), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # Granted and cancelled in the same tick: hand the permit on.
                self.release()
            raise

    def release(self) -> None:
        while self._queue:
            _, _, fut = heapq.heappop(self._queue)
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    @asynccontextmanager
    async def slot(self, priority: tuple[int, ...]) -> AsyncIterator[None]:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()
