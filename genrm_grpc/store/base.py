"""Where the cohort core keeps what must outlive a cohort: watermarks and tombstones.

The registry talks to exactly this interface. The in-memory implementation is the
default; durable (SQLite) and shared (Redis) implementations plug in behind it.
Every method must cost O(1) or O(log n) (amortised) in the number of stored records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from genrm_grpc.cohort.model import CohortKey, Tombstone


class CohortStore(Protocol):
    #: Called with ("tombstone", key) or ("watermark", scope) for each record that
    #: retention drops (the registry drops it from the durable store too).
    on_evict: Callable[[str, CohortKey | str], None]

    def watermark(self, group_id: str, now: float) -> int | None:
        """The newest attempt seen for ``group_id`` (None when unknown or expired)."""

    def raise_watermark(
        self, group_id: str, attempt: int, now: float, expires_at: float | None = None
    ) -> None:
        """Record ``attempt`` if it is newer, and refresh the watermark's retention
        (until ``expires_at`` when given, else for the configured TTL)."""

    def tombstone(self, key: CohortKey, now: float) -> Tombstone | None:
        """The tombstone of a terminal cohort (None when unknown or expired)."""

    def put_tombstone(
        self, tombstone: Tombstone, now: float, expires_at: float | None = None
    ) -> None: ...

    def evict(self, now: float, pinned: Callable[[str], bool]) -> int:
        """Drop expired / surplus records; never a watermark for which ``pinned`` holds.

        Returns the number of records examined, so tests can show the amortised cost.
        """

    def counts(self) -> Mapping[str, int]:
        """Sizes of each kind of record (for metrics and leak checks)."""
