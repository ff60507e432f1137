"""The seam between a runtime that decides one group at a time and where groups live.

:class:`GroupStore` is every call ``runtime/group_decisions.py``, ``runtime/leased.py``
and ``runtime/replica.py`` make on the group state they share with other replicas:
versioned reads of one group, a compare-and-set commit, the evaluation lease, the
deadline and orphan indexes, the outcome channel and the journal of passes. Two
implementations satisfy it: ``genrm_grpc.store.shared.SharedGroups`` over Redis, and
``genrm_grpc.store.local.LocalGroups`` in process (a single process as the one-replica
case, with its SQLite file or nothing behind it, docs/architecture.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from genrm_grpc.cohort.model import CohortKey, Tombstone
from genrm_grpc.cohort.records import Record, RecoveredCohort, VerdictRecord
from genrm_grpc.store.group_state import Committed, GroupState, SharedStats
from genrm_grpc.store.lease import Lease


class GroupJournal(Protocol):
    """Where an evaluation's passes are journaled (fenced by its lease), and looked up."""

    #: False when nothing outlives the process: a drain then fails the active cohorts.
    survives_restart: bool

    @property
    def write_failures(self) -> int:
        """Journal writes that failed and are not counted in the group store's own
        ``stats.failures`` (a batch refused because its lease was lost is not one)."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def persist(
        self, records: Sequence[Record], *, lease: Lease | None = None
    ) -> asyncio.Future[None]: ...
    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None: ...


class GroupStore(Protocol):
    @property
    def address(self) -> str: ...
    @property
    def lease_s(self) -> float: ...
    @property
    def stats(self) -> SharedStats: ...
    @property
    def store(self) -> GroupJournal: ...

    #: True when other processes decide on the same groups (Redis); False for one
    #: process's own store, whose cohorts wait for that process's restart.
    shared_by_replicas: bool

    async def connect(self) -> int: ...
    async def census(self, now: float) -> tuple[int, int, int, int]: ...

    # one group: read, then commit if it is still as read
    async def load(self, key: CohortKey) -> GroupState: ...
    async def version(self, key: CohortKey) -> str: ...
    async def commit(
        self,
        state: GroupState,
        records: Sequence[Record],
        *,
        ended: Sequence[Tombstone] = (),
        evaluate: CohortKey | None = None,
        collect: CohortKey | None = None,
        grown: Sequence[CohortKey] = (),
        fence: Lease | None = None,
    ) -> Committed: ...

    # evaluations and their leases
    async def load_evaluation(
        self, key: CohortKey
    ) -> tuple[RecoveredCohort | None, list[VerdictRecord]]: ...
    def lease_for(self, key: CohortKey, token: int, taken_at: float | None = None) -> Lease: ...
    async def claim(self, key: CohortKey) -> Lease | None: ...
    async def renew(self, key: CohortKey, lease: Lease) -> Lease | None: ...
    async def release(self, key: CohortKey, lease: Lease) -> None: ...
    def lease_now(self) -> float:
        """Now, in the time a lease's ``valid_until`` counts in."""

    # indexes and outcomes
    async def due(self, now: float, limit: int = 64) -> list[CohortKey]: ...
    async def orphaned(self, now: float, limit: int = 16) -> list[CohortKey]: ...
    async def forget(self, key: CohortKey) -> None: ...
    def watch_due(self, on_due: Callable[[CohortKey], None]) -> Callable[[], None] | None:
        """Have ``on_due(key)`` called when a deadline is due, if this store times its
        deadlines itself (then returns what stops it); None when the runtime must poll
        :meth:`due` (Redis: any replica may have filed it)."""

    async def active_keys(self) -> list[CohortKey]: ...
    async def outcomes(self, keys: Iterable[CohortKey]) -> dict[CohortKey, Tombstone]: ...
    async def listen(
        self,
        on_ended: Callable[[CohortKey], None],
        on_subscribed: Callable[[], Awaitable[None]],
        *,
        stopping: asyncio.Event,
        on_grown: Callable[[CohortKey], None] | None = None,
    ) -> None: ...


@runtime_checkable
class InstantGroups(Protocol):
    """A group store that answers in process, without a round trip (``LocalGroups``):
    a decision that needs no wait is made without a task, and its commit, when a file
    is behind, completes by callback. Redis always needs a round trip: not this."""

    def load_now(self, key: CohortKey) -> GroupState | None: ...
    def version_now(self, key: CohortKey) -> str | None: ...
    def counts_now(self) -> tuple[int, int, int, int]:
        """What :meth:`GroupStore.census` counts, as held now (nothing expired here)."""
        ...

    def begin_commit(
        self,
        state: GroupState,
        records: Sequence[Record],
        *,
        ended: Sequence[Tombstone] = (),
        evaluate: CohortKey | None = None,
        collect: CohortKey | None = None,
        grown: Sequence[CohortKey] = (),
        fence: Lease | None = None,
    ) -> Committed | asyncio.Future[Committed]: ...
