"""Client-minted group identities (time-ordered, UUIDv7 layout) and per-group attempts."""

from __future__ import annotations

import os
import threading
import time
import uuid

__all__ = ["GroupAttempts", "new_group_id", "uuid7"]

_lock = threading.Lock()
_last_ms = 0
_last_counter = 0


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, 12-bit counter, 62 random bits.

    The 12-bit field is a per-process counter seeded randomly each millisecond, so ids
    minted in one process are strictly increasing even within one millisecond; the
    random tail makes ids of different processes and hosts unique.
    """
    global _last_ms, _last_counter
    with _lock:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        if ms <= _last_ms:
            ms = _last_ms
            _last_counter += 1
            if _last_counter > 0xFFF:  # counter overflow: borrow the next millisecond
                ms += 1
                _last_counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        else:
            _last_counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _last_ms = ms
        counter = _last_counter
    tail = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= tail
    return uuid.UUID(int=value)


def new_group_id(prefix: str = "") -> str:
    """A fresh group id: ``prefix`` + a UUIDv7 string (sorts by creation time)."""
    return f"{prefix}{uuid7()}"


class GroupAttempts:
    """The newest ``group_attempt`` this client used (or learnt) for each group id."""

    def __init__(self, max_groups: int = 100_000) -> None:
        self._latest: dict[str, int] = {}
        self._max_groups = max_groups
        self._lock = threading.Lock()

    def latest(self, group_id: str) -> int | None:
        with self._lock:
            return self._latest.get(group_id)

    def current(self, group_id: str) -> int:
        """The attempt a resubmission should use: the newest seen, else 0."""
        latest = self.latest(group_id)
        return 0 if latest is None else latest

    def next(self, group_id: str) -> int:
        """The attempt a replacement group should use (newest + 1, or 0 for a new group)."""
        latest = self.latest(group_id)
        return 0 if latest is None else latest + 1

    def record(self, group_id: str, attempt: int) -> None:
        with self._lock:
            if attempt > self._latest.get(group_id, -1):
                self._latest.pop(group_id, None)  # re-insert: most recently used last
                self._latest[group_id] = attempt
            while len(self._latest) > self._max_groups:  # bounded: forget the oldest
                del self._latest[next(iter(self._latest))]

    def forget(self, group_id: str) -> None:
        with self._lock:
            self._latest.pop(group_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._latest)
