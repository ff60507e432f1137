"""The facts the cohort core decides, as records: what a store must keep for a restart.

The registry decides; the runtime turns each decision into records and hands them to a
store's ``persist`` before it answers anyone whose answer depends on them. Records are
plain, immutable values with wall-clock instants (monotonic clocks do not survive a
restart). They are the core's own types: the stores (``genrm_grpc/store/``) import them
and encode them, the core never imports a store.

``CohortStore`` is the one interface the registry needs from outside: where watermarks
and tombstones are kept and retired (the in-memory implementation is the default; durable
and shared stores plug in behind it). Every method must cost O(1) or O(log n) (amortised)
in the number of stored records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from genrm_grpc.cohort.model import (
    CohortKey,
    MemberCoords,
    Phase,
    PromptSpec,
    Tombstone,
)
from genrm_grpc.scoring.types import AnswerTexts, Verdict


@dataclass(frozen=True, slots=True)
class CohortRecord:
    """An active cohort's header: phase and deadlines (wall clock, seconds since epoch)."""

    key: CohortKey
    seq: int
    group_size: int
    prompt: PromptSpec
    prompt_digest: str
    phase: Phase  # COLLECTING or EVALUATING: only active cohorts have a header
    created_at: float
    collection_deadline: float
    evaluation_deadline: float | None = None
    #: An earlier attempt of its group was seen (its verdicts may be reused).
    follows_attempt: bool = False


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One accepted member of an active cohort, with the texts the judge needs."""

    key: CohortKey
    coords: MemberCoords
    digest: str
    texts: AnswerTexts


@dataclass(frozen=True, slots=True)
class DropCohort:
    """The cohort ended: its header and member bodies go (its tombstone replaces them).

    Its journaled verdicts stay while its tombstone does (``keep_verdicts``), for reuse
    by a later attempt of the group; a retired legacy cohort leaves nothing.
    """

    key: CohortKey
    keep_verdicts: bool = True


@dataclass(frozen=True, slots=True)
class DropTombstone:
    """Retention dropped a tombstone: it goes, with the verdicts journaled for it."""

    key: CohortKey


@dataclass(frozen=True, slots=True)
class DropWatermark:
    scope: str


@dataclass(frozen=True, slots=True)
class TombstoneRecord:
    tombstone: Tombstone  # ``finished_at`` in wall-clock seconds
    expires_at: float


@dataclass(frozen=True, slots=True)
class WatermarkRecord:
    """The newest attempt seen for a group scope (raised, never lowered)."""

    scope: str
    attempt: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class VerdictRecord:
    """One finished judge pass, journaled the moment it finished.

    ``cohort`` is the cohort it was judged for; ``scope`` the group it may be reused in
    (None: never reused outside its own cohort, as for legacy keys). The lookup identity
    of a verdict is (scope or cohort, ``context``, ``first``, ``second``,
    ``judge_index``, ``swap``): ``context`` digests the prompt and every judge setting
    that can change a verdict, ``first``/``second`` are the response digests in the
    order the pass compares them.
    """

    cohort: CohortKey
    scope: str | None
    context: str
    first: str
    second: str
    judge_index: int
    swap: bool
    response_i: int
    response_j: int
    verdict: Verdict
    usage: tuple[int, int, int] | None  # input, output, reasoning tokens
    finished_at: float


Record = (
    CohortRecord
    | MemberRecord
    | DropCohort
    | TombstoneRecord
    | DropTombstone
    | WatermarkRecord
    | DropWatermark
    | VerdictRecord
)


@dataclass(frozen=True, slots=True)
class RecoveredCohort:
    header: CohortRecord
    members: tuple[MemberRecord, ...]


@dataclass(frozen=True, slots=True)
class Recovered:
    """Everything a store holds that has not expired, as read at start-up."""

    cohorts: tuple[RecoveredCohort, ...] = ()
    tombstones: tuple[TombstoneRecord, ...] = ()
    watermarks: tuple[WatermarkRecord, ...] = ()
    verdicts: tuple[VerdictRecord, ...] = ()


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
