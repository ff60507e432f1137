"""Core values of the cohort protocol: coordinates, keys, members, outcomes, rejections.

Everything here is transport-free and immutable except :class:`Cohort`, which the
registry owns and mutates.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from genrm_grpc.scoring.types import AnswerTexts, JudgedPair


class Reason(enum.StrEnum):
    """ErrorInfo reasons of PROTOCOL.md (the wire names)."""

    INVALID_MEMBER = "INVALID_MEMBER"
    SLOT_CONFLICT = "SLOT_CONFLICT"
    COHORT_CLOSED = "COHORT_CLOSED"
    PROMPT_MISMATCH = "PROMPT_MISMATCH"
    ATTEMPT_SUPERSEDED = "ATTEMPT_SUPERSEDED"
    COHORT_FAILED = "COHORT_FAILED"
    CAPACITY_EXHAUSTED = "CAPACITY_EXHAUSTED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    JUDGE_FAILED = "JUDGE_FAILED"


class Phase(enum.Enum):
    COLLECTING = "collecting"
    EVALUATING = "evaluating"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class MemberCoords:
    """The member's coordinates exactly as the client sent them (None = absent)."""

    rollout_index: int
    group_id: str | None = None
    group_attempt: int | None = None
    task_index: int | None = None
    prompt_id: str | None = None
    group_size: int | None = None


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """The conversation a group answered, plus its optional principle and baseline."""

    messages: tuple[tuple[str, str], ...]
    principle: str | None = None
    baseline_response: str | None = None


@dataclass(frozen=True, slots=True)
class CandidateSpec:
    """One answer: the texts the judge and the bonuses need, and the payload digest."""

    texts: AnswerTexts
    digest: str


@dataclass(frozen=True, slots=True, order=True)
class CohortKey:
    """Identity of one cohort: an explicit group attempt, or a legacy key plus attempt."""

    group_id: str | None
    legacy_key: str | None
    attempt: int

    @property
    def explicit(self) -> bool:
        return self.group_id is not None

    def __str__(self) -> str:
        if self.group_id is not None:
            return f"g:{self.group_id}#{self.attempt}"
        return f"legacy:{self.legacy_key}#{self.attempt}"


@dataclass(frozen=True, slots=True)
class Submission:
    """A validated member submission, resolved against the server's defaults."""

    coords: MemberCoords
    key: CohortKey
    group_size: int
    prompt: PromptSpec
    prompt_digest: str
    candidate: CandidateSpec

    @property
    def rollout_index(self) -> int:
        return self.coords.rollout_index


@dataclass(frozen=True, slots=True)
class MemberReward:
    """One member's reward in a completed cohort (no answer text kept)."""

    reward: float
    score_raw: float
    overall_score: float
    length_adjustment: float
    comparisons: tuple[JudgedPair, ...] = ()


@dataclass(frozen=True, slots=True)
class Completed:
    """Rewards for every member, published together."""

    rewards: tuple[MemberReward, ...]
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: Every verdict in aggregation order (judge pass, then pair order).
    judged: tuple[JudgedPair, ...] = ()


@dataclass(frozen=True, slots=True)
class Masked:
    """The judge failed: the cohort completes, every member is masked (reward 0.0)."""

    reason: str
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failed:
    """The cohort failed before it could be rewarded (deadline, supersession, ...)."""

    reason: str
    legacy: bool = False


Outcome = Completed | Masked | Failed

MAX_FAILURE_REASON = 2000

LEGACY_RETRY_ADVICE = (
    "This cohort has no group_id (legacy key by task_index/prompt_id + prompt digest). "
    "To retry, regenerate the whole group under a fresh group_id shared by every member; "
    "reusing the task/prompt key could mix delayed answers with the replacement."
)


def clip_reason(text: str) -> str:
    return text if len(text) <= MAX_FAILURE_REASON else text[: MAX_FAILURE_REASON - 1] + "…"


@dataclass(frozen=True, slots=True)
class Rejection:
    """A refusal: the reason (mapped to a status code at the edge), a message, metadata."""

    reason: Reason
    message: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Member:
    """An accepted member of an active cohort. Its texts are dropped when the cohort ends."""

    coords: MemberCoords
    candidate: CandidateSpec


@dataclass(slots=True, eq=False)
class Cohort:
    """One active group attempt. Owned and mutated by the registry only."""

    key: CohortKey
    seq: int
    group_size: int
    prompt: PromptSpec
    prompt_digest: str
    created_at: float
    collection_deadline: float
    members: dict[int, Member] = field(default_factory=dict)
    phase: Phase = Phase.COLLECTING
    evaluation_deadline: float | None = None
    snapshot: tuple[Member, ...] | None = None
    outcome: Outcome | None = None

    @property
    def active(self) -> bool:
        return self.phase in (Phase.COLLECTING, Phase.EVALUATING)

    @property
    def full(self) -> bool:
        return len(self.members) == self.group_size


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What a terminal cohort leaves behind: digests and outcome, never answer bodies."""

    key: CohortKey
    group_size: int
    prompt_digest: str
    digests: Mapping[int, str]
    outcome: Outcome
    finished_at: float
