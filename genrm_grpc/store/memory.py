"""In-process store: insertion-ordered dicts give O(1) lookups and amortised O(1) eviction.

Tombstones are written when cohorts end, so with one TTL for all of them insertion
order is expiry order: eviction only ever looks at the oldest entries. Watermarks are
moved to the end whenever they are touched, for the same reason.

Retained entries hold no object the cyclic garbage collector tracks: tombstones are kept
as one ``bytes`` each (their expiry, 8 bytes, then their ``record()``) under plain
``(group_id, legacy_key, attempt, principal)`` tuples, so a full collection costs the
same with 50,000 retained cohorts as with 100, and a retained tombstone is one object
besides its key.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Protocol

from genrm_grpc.cohort.model import CohortKey, Tombstone

_PINNED_ROTATIONS_PER_EVICT = 2

#: A retained tombstone's key: its cohort key's identity as a plain tuple, which the
#: cyclic garbage collector stops tracking (a ``CohortKey`` is tracked).
RetainedKey = tuple[str | None, str | None, int, str]

#: A tombstone entry starts with its expiry (a native double), then its record.
_EXPIRY = struct.Struct("d")


def retained_key(key: CohortKey) -> RetainedKey:
    return (key.group_id, key.legacy_key, key.attempt, key.principal)


def retained_tombstone(expires_at: float, record: bytes) -> bytes:
    """A retained tombstone as one ``bytes``: its expiry, then its ``record()``."""
    return _EXPIRY.pack(expires_at) + record


def expiry_of(entry: bytes) -> float:
    """The instant a retained entry (a tombstone, or anything packed from an expiry
    first) expires."""
    return float(_EXPIRY.unpack_from(entry)[0])


def record_of(entry: bytes) -> bytes:
    """A retained tombstone's ``record()``."""
    return entry[_EXPIRY.size :]


class StoreView(Protocol):
    """The settings the store reads (a scoped view; ``Settings`` satisfies it)."""

    @property
    def cohort_result_ttl_s(self) -> float: ...
    @property
    def max_terminal_cohorts(self) -> int: ...


class MemoryStore:
    def __init__(self, config: StoreView) -> None:
        self._ttl = config.cohort_result_ttl_s
        self._max = config.max_terminal_cohorts
        self._tombstones: OrderedDict[RetainedKey, bytes] = OrderedDict()
        self._watermarks: OrderedDict[str, tuple[float, int]] = OrderedDict()
        #: Told of every tombstone (its key) and watermark (its scope) that retention
        #: drops, so that a durable store drops it too.
        self.on_evict: Callable[[str, CohortKey | str], None] = _ignore

    def watermark(self, group_id: str, now: float) -> int | None:
        entry = self._watermarks.get(group_id)
        if entry is None:
            return None
        return entry[1]

    def raise_watermark(
        self, group_id: str, attempt: int, now: float, expires_at: float | None = None
    ) -> None:
        entry = self._watermarks.pop(group_id, None)
        newest = attempt if entry is None else max(entry[1], attempt)
        expires = now + self._ttl if expires_at is None else expires_at
        if entry is not None:
            expires = max(expires, entry[0])
        self._watermarks[group_id] = (expires, newest)

    def tombstone(self, key: CohortKey, now: float) -> Tombstone | None:
        entry = self._tombstones.get(retained_key(key))
        if entry is None or expiry_of(entry) <= now:
            return None
        return Tombstone.from_record(record_of(entry))

    def put_tombstone(
        self, tombstone: Tombstone, now: float, expires_at: float | None = None
    ) -> None:
        key = retained_key(tombstone.key)
        tombs = self._tombstones
        tombs.pop(key, None)
        expires = now + self._ttl if expires_at is None else expires_at
        tombs[key] = retained_tombstone(expires, tombstone.record())
        # The bound holds at insert, not only at the next sweep: cohorts that end by
        # timer or shutdown, with no submission in between, must not pile up.
        while len(tombs) > self._max:
            dropped, _ = tombs.popitem(last=False)
            self.on_evict("tombstone", CohortKey(*dropped))

    def evict(self, now: float, pinned: Callable[[str], bool]) -> int:
        examined = 0
        tombs = self._tombstones
        while tombs:
            key, entry = next(iter(tombs.items()))
            examined += 1
            if expiry_of(entry) > now and len(tombs) <= self._max:
                break
            del tombs[key]
            self.on_evict("tombstone", CohortKey(*key))
        marks = self._watermarks
        # A pinned watermark (its group has an active cohort) is refreshed and moved to
        # the end rather than dropped. Only a few are moved per call: with more active
        # groups than ``max_terminal_cohorts`` an unbounded loop would rotate all of them on every
        # request. Unpinned ones are dropped as they reach the front, so the surplus
        # still drains, and each drop is paid for by the insertion that made it.
        rotations = 0
        while marks and rotations < _PINNED_ROTATIONS_PER_EVICT:
            group_id, (expires, attempt) = next(iter(marks.items()))
            examined += 1
            if expires > now and len(marks) <= self._max:
                break
            del marks[group_id]
            if pinned(group_id):
                marks[group_id] = (now + self._ttl, attempt)
                rotations += 1
            else:
                self.on_evict("watermark", group_id)
        return examined

    def counts(self) -> Mapping[str, int]:
        return {
            "tombstones": len(self._tombstones),
            "watermarks": len(self._watermarks),
        }


def _ignore(kind: str, key: CohortKey | str) -> None:
    return None
