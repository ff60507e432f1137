"""The clock of the group stores and of the replicas' runtime: wall-clock seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from genrm_grpc.cohort.clock import TimerHandle


class WallClock:
    """Wall-clock seconds (``time.time()``): what replicas sharing a store compare.

    Deadlines written by one replica are read by another, so the replicas' runtimes
    count in the time they all share (kept in step by NTP), not in a process's own
    monotonic clock. Its timers are the running loop's.
    """

    def now(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(0.0, when - time.time()), callback)
