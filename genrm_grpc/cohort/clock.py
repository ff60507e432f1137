"""What a clock is, for whoever executes the core's decisions (a protocol, no clock).

The core itself takes ``now`` as an argument; the stores and the runtime that execute
its deadlines take a :class:`Clock` (``genrm_grpc.store.clock.WallClock`` in service,
``genrm_grpc.testing.ManualClock`` in tests), so that tests move time by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle: ...
