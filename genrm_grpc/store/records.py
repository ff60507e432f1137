"""What the durable stores write: one record type per kind of fact, and their encoding.

The registry decides; the runtime turns each decision into records and hands them to a
store's ``persist`` before it answers anyone whose answer depends on them. Records are
plain, immutable values with wall-clock instants (monotonic clocks do not survive a
restart), encoded as compact JSON so that every backend (SQLite rows, Redis values)
stores the same bytes.

Keys are encoded generically from the :class:`CohortKey` dataclass fields, so a field
added to the key (a principal, say) is persisted without a schema change.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from genrm_grpc.cohort.model import (
    CohortKey,
    Completed,
    Failed,
    Masked,
    MemberCoords,
    MemberReward,
    Outcome,
    PromptSpec,
    Tombstone,
    comparisons_of,
)
from genrm_grpc.scoring.types import AnswerTexts, JudgedPair, Verdict


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
    return _dumps(list(dataclasses.astuple(key)))


def decode_key(text: str) -> CohortKey:
    return CohortKey(*json.loads(text))


def encode_prompt(prompt: PromptSpec) -> str:
    return _dumps([[list(m) for m in prompt.messages], prompt.principle, prompt.baseline_response])


def decode_prompt(text: str) -> PromptSpec:
    messages, principle, baseline = json.loads(text)
    return PromptSpec(tuple((role, content) for role, content in messages), principle, baseline)


def encode_coords(coords: MemberCoords) -> str:
    return _dumps(list(dataclasses.astuple(coords)))


def decode_coords(text: str) -> MemberCoords:
    return MemberCoords(*json.loads(text))


def _pair(pair: JudgedPair) -> list[Any]:
    v = pair.verdict
    return [
        pair.response_i,
        pair.response_j,
        pair.judge_index,
        v.score_1,
        v.score_2,
        v.ranking,
        v.parse_failed,
    ]


def _unpair(row: Sequence[Any]) -> JudgedPair:
    i, j, k, s1, s2, rank, failed = row
    return JudgedPair(i, j, k, Verdict(s1, s2, rank, bool(failed)))


def encode_outcome(outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        body: dict[str, Any] = {
            "kind": "completed",
            "rewards": [
                [r.reward, r.score_raw, r.overall_score, r.length_adjustment]
                for r in outcome.rewards
            ],
            "metrics": dict(outcome.metrics),
            "judged": [_pair(p) for p in outcome.judged],
        }
        # Each member's comparisons are normally its verdicts in judged order; only a
        # hand-built outcome whose are not needs them spelt out.
        if any(
            r.comparisons != comparisons_of(k, outcome.judged)
            for k, r in enumerate(outcome.rewards)
        ):
            body["comparisons"] = [[_pair(p) for p in r.comparisons] for r in outcome.rewards]
        return _dumps(body)
    if isinstance(outcome, Masked):
        return _dumps(
            {"kind": "masked", "reason": outcome.reason, "metrics": dict(outcome.metrics)}
        )
    return _dumps({"kind": "failed", "reason": outcome.reason, "legacy": outcome.legacy})


def decode_outcome(text: str) -> Outcome:
    body = json.loads(text)
    kind = body["kind"]
    if kind == "masked":
        return Masked(reason=body["reason"], metrics=body["metrics"])
    if kind == "failed":
        return Failed(body["reason"], legacy=body["legacy"])
    if kind != "completed":
        raise StoreError(f"unknown outcome kind {kind!r} in the store")
    judged = tuple(_unpair(p) for p in body["judged"])
    explicit = body.get("comparisons")
    rewards = tuple(
        MemberReward(
            reward,
            raw,
            overall,
            adjustment,
            tuple(_unpair(p) for p in explicit[k]) if explicit else comparisons_of(k, judged),
        )
        for k, (reward, raw, overall, adjustment) in enumerate(body["rewards"])
    )
    return Completed(rewards=rewards, metrics=body["metrics"], judged=judged)
