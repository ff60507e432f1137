"""What the durable stores write: one record type per kind of fact, and their encoding.

The registry decides; the runtime turns each decision into records and hands them to a
store's ``persist`` before it answers anyone whose answer depends on them. Records are
plain, immutable values with wall-clock instants (monotonic clocks do not survive a
restart). Keys, prompts and coordinates are encoded here as compact JSON; a tombstone
is stored as its own packed bytes (``Tombstone.record()``), the form the memory store
already keeps.

Keys are encoded generically from the :class:`CohortKey` dataclass fields, so a field
added to the key (a principal, say) is persisted without a schema change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from genrm_grpc.cohort.model import (
    CohortKey,
    MemberCoords,
    PromptSpec,
    Tombstone,
)
from genrm_grpc.scoring.types import AnswerTexts, Verdict

#: How many recent timings a store keeps for tests, benchmarks and metrics.
RECENT_SAMPLES = 4096


def keep_recent(samples: list[float], value: float) -> None:
    """Append a timing, dropping the older half once ``RECENT_SAMPLES`` are kept."""
    if len(samples) >= RECENT_SAMPLES:
        del samples[: RECENT_SAMPLES // 2]
    samples.append(value)


class StoreError(Exception):
    """A store could not read or write: the affected calls fail, nothing is published."""


class StoreSchemaError(StoreError):
    """The store's file is unreadable or was written by a newer server: refuse to start."""


# ---------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class CohortRecord:
    """An active cohort's header: phase and deadlines (wall clock, seconds since epoch)."""

    key: CohortKey
    seq: int
    group_size: int
    prompt: PromptSpec
    prompt_digest: str
    phase: str  # "collecting" | "evaluating"
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


# ---------------------------------------------------------------------- encoding
def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def encode_key(key: CohortKey) -> str:
    """A stable text for a cohort key (the tuple of its fields, as JSON)."""
    # The fields by hand: dataclasses.astuple deep-copies and costs several µs per record.
    return _dumps([key.group_id, key.legacy_key, key.attempt, key.principal])


def decode_key(text: str) -> CohortKey:
    return CohortKey(*json.loads(text))


def encode_prompt(prompt: PromptSpec) -> str:
    return _dumps([[list(m) for m in prompt.messages], prompt.principle, prompt.baseline_response])


def decode_prompt(text: str) -> PromptSpec:
    messages, principle, baseline = json.loads(text)
    return PromptSpec(tuple((role, content) for role, content in messages), principle, baseline)


def encode_coords(coords: MemberCoords) -> str:
    c = coords
    return _dumps(
        [c.rollout_index, c.group_id, c.group_attempt, c.task_index, c.prompt_id, c.group_size]
    )


def decode_coords(text: str) -> MemberCoords:
    return MemberCoords(*json.loads(text))
