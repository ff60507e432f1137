"""Core values of the cohort protocol: coordinates, keys, members, outcomes, rejections.

Everything here is transport-free and immutable except :class:`Cohort`, which the
registry owns and mutates. The outcomes (``Completed``, ``Masked``, ``Failed``) are in
``cohort/outcome.py`` and a tombstone's packing and record format in
``cohort/packing.py``; this module re-exports the outcomes, so one import serves.
"""

from __future__ import annotations

import enum
import marshal
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from genrm_grpc.cohort.outcome import (
    Completed,
    Failed,
    Masked,
    MemberReward,
    Outcome,
    comparisons_by_member,
    comparisons_of,
    reward_problem,
)
from genrm_grpc.cohort.packing import (
    DIGEST_BYTES,
    MARSHAL_FORMAT,
    RECORD_VERSION,
    PackedCompleted,
    digest_field,
    unpack_array,
)
from genrm_grpc.scoring.types import AnswerTexts

__all__ = [
    "ANONYMOUS",
    "LEGACY_RETRY_ADVICE",
    "MAX_FAILURE_REASON",
    "MAX_METADATA_VALUE_BYTES",
    "CandidateSpec",
    "Cohort",
    "CohortKey",
    "Completed",
    "Failed",
    "Masked",
    "Member",
    "MemberCoords",
    "MemberReward",
    "Outcome",
    "Phase",
    "PromptSpec",
    "Reason",
    "Rejection",
    "Submission",
    "Tombstone",
    "clip",
    "clip_reason",
    "comparisons_by_member",
    "comparisons_of",
    "group_scope",
    "reward_problem",
]


class Reason(enum.StrEnum):
    """ErrorInfo reasons of docs/protocol.md (the wire names)."""

    INVALID_MEMBER = "INVALID_MEMBER"
    SLOT_CONFLICT = "SLOT_CONFLICT"
    COHORT_CLOSED = "COHORT_CLOSED"
    PROMPT_MISMATCH = "PROMPT_MISMATCH"
    ATTEMPT_SUPERSEDED = "ATTEMPT_SUPERSEDED"
    COHORT_FAILED = "COHORT_FAILED"
    CAPACITY_EXHAUSTED = "CAPACITY_EXHAUSTED"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    JUDGE_FAILED = "JUDGE_FAILED"
    COHORT_NOT_FOUND = "COHORT_NOT_FOUND"  # GetCohort only
    #: A call without a client deadline waited max_call_wait_s (its member stays).
    CALL_WAIT_EXPIRED = "CALL_WAIT_EXPIRED"
    #: The durable store could not write (or read) what this answer depends on.
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"


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


#: The principal of every caller when neither a bearer token nor a client certificate
#: names one (a server without auth has exactly this one principal).
ANONYMOUS = ""


@dataclass(frozen=True, slots=True, order=True)
class CohortKey:
    """Identity of one cohort: an explicit group attempt, or a legacy key plus attempt.

    Every key belongs to a ``principal`` (the authenticated caller): two principals that
    use the same ``group_id`` never share a cohort, a watermark or a tombstone.
    """

    group_id: str | None
    legacy_key: str | None
    attempt: int
    principal: str = ANONYMOUS
    #: Worked out once per key (not part of its identity): a decision hashes and scopes
    #: the same key a few dozen times, and a key is made once per call.
    _hash: int = field(init=False, repr=False, compare=False, default=0)
    _scope: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        fields = (self.group_id, self.legacy_key, self.attempt, self.principal)
        object.__setattr__(self, "_hash", hash(fields))
        if self.group_id is not None:
            object.__setattr__(self, "_scope", group_scope(self.principal, self.group_id))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[CohortKey], tuple[str | None, str | None, int, str]]:
        # Made again from its identity: a string's hash differs from process to process.
        return (CohortKey, (self.group_id, self.legacy_key, self.attempt, self.principal))

    @property
    def explicit(self) -> bool:
        return self.group_id is not None

    @property
    def group_scope(self) -> str | None:
        """The principal's group: what watermarks and supersession are keyed by."""
        return self._scope

    def __str__(self) -> str:
        owner = f"@{self.principal}" if self.principal else ""
        if self.group_id is not None:
            return f"g:{self.group_id}#{self.attempt}{owner}"
        return f"legacy:{self.legacy_key}#{self.attempt}{owner}"


def group_scope(principal: str, group_id: str) -> str:
    """One string per (principal, group_id); the length prefix makes it unambiguous."""
    return f"{len(principal)}:{principal}{group_id}"


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


MAX_FAILURE_REASON = 2000
#: Every value echoed back in ErrorInfo metadata is at most this many UTF-8 bytes, so
#: an error trailer always fits a client's metadata limit (8 KiB by default).
MAX_METADATA_VALUE_BYTES = 512

LEGACY_RETRY_ADVICE = (
    "This cohort has no group_id (legacy key by task_index/prompt_id + prompt digest). "
    "To retry, regenerate the whole group under a fresh group_id shared by every member; "
    "reusing the task/prompt key could mix delayed answers with the replacement."
)


def clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, ending in "…" when it was cut.

    The one clipper for everything echoed to a client (failure reasons, status messages,
    ErrorInfo metadata): bytes, not characters, because trailers are limited in bytes.
    """
    if len(text) * 4 <= max_bytes:  # fast path: even all 4-byte characters would fit
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text
    ellipsis = "…".encode()
    cut = raw[: max(0, max_bytes - len(ellipsis))].decode("utf-8", "ignore")
    return cut + "…" if max_bytes >= len(ellipsis) else ""


def clip_reason(text: str) -> str:
    """A failure reason as recorded and published (≤ ``MAX_FAILURE_REASON`` bytes)."""
    return clip(text, MAX_FAILURE_REASON)


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
    #: An earlier attempt of its group was seen: its journaled verdicts may be reused.
    follows_attempt: bool = False

    @property
    def active(self) -> bool:
        return self.phase in (Phase.COLLECTING, Phase.EVALUATING)

    @property
    def full(self) -> bool:
        return len(self.members) == self.group_size


_ABSENT = bytes(DIGEST_BYTES)


class Tombstone:
    """What a terminal cohort leaves behind: digests and outcome, never answer bodies.

    Stored compactly (raw digests in one ``bytes``, a completed outcome packed into
    arrays, see ``PackedCompleted``) because thousands are retained; the accessors
    rebuild the plain values. A store keeps it as ``record()``, one immutable ``bytes``
    that the cyclic garbage collector does not track, so tens of thousands of retained
    cohorts add nothing to a full collection (a Tombstone object with its arrays is
    about ten tracked objects); ``from_record`` rebuilds it for a lookup.
    """

    __slots__ = (
        "_digests",
        "_outcome",
        "_record",
        "finished_at",
        "group_size",
        "key",
        "prompt_digest",
    )

    def __init__(
        self,
        key: CohortKey,
        group_size: int,
        prompt_digest: str,
        digests: Mapping[int, str],
        outcome: Outcome,
        finished_at: float,
    ) -> None:
        self.key = key
        self.group_size = group_size
        self.prompt_digest = prompt_digest
        self.finished_at = finished_at
        packed = bytearray(_ABSENT * group_size)
        for slot, digest in digests.items():
            packed[slot * DIGEST_BYTES : (slot + 1) * DIGEST_BYTES] = bytes.fromhex(digest)
        self._digests = bytes(packed)
        self._outcome: PackedCompleted | Masked | Failed = (
            PackedCompleted(outcome) if isinstance(outcome, Completed) else outcome
        )
        self._record: bytes | None = None

    def record(self) -> bytes:
        """This tombstone as one ``bytes`` (not tracked by the cyclic GC); see from_record.

        Made once: a tombstone never changes, and the registry's store, the group store
        and an outcome mailbox all keep the same bytes."""
        made = self._record
        if made is None:
            made = self._record = self._pack()
        return made

    def _pack(self) -> bytes:
        kept = self._outcome
        outcome: tuple[Any, ...]
        if isinstance(kept, PackedCompleted):
            outcome = ("c", *kept.to_fields())
        elif isinstance(kept, Masked):
            outcome = (
                "m",
                str(kept.reason),
                tuple(str(name) for name in kept.metrics),
                array("d", kept.metrics.values()).tobytes(),
                kept.passes_reused,
                kept.passes_resumed,
            )
        else:
            outcome = ("f", str(kept.reason), kept.legacy)
        key = self.key
        return marshal.dumps(
            (
                RECORD_VERSION,
                key.group_id,
                key.legacy_key,
                key.attempt,
                key.principal,
                self.group_size,
                digest_field(self.prompt_digest),
                self.finished_at,
                self._digests,
                *outcome,
            ),
            MARSHAL_FORMAT,
        )

    @classmethod
    def from_record(cls, record: bytes) -> Tombstone:
        """The tombstone that ``record()`` packed."""
        (version, gid, legacy, attempt, principal, size, prompt, finished, digests, kind, *rest) = (
            marshal.loads(record)
        )
        if version not in (1, 2, RECORD_VERSION):
            raise ValueError(f"unknown tombstone record version {version}")
        self = cls.__new__(cls)
        self.key = CohortKey(gid, legacy, attempt, principal)
        self.group_size = size
        self.prompt_digest = prompt.hex() if isinstance(prompt, bytes) else prompt
        self.finished_at = finished
        self._digests = digests
        self._record = record if version == RECORD_VERSION and isinstance(record, bytes) else None
        if kind == "c":
            self._outcome = PackedCompleted.from_fields(tuple(rest), version)
        elif kind == "m":
            reason, names, values, *passes = rest
            reused, resumed = passes if passes else (0, 0)
            self._outcome = Masked(
                reason=str(reason),
                metrics=dict(zip(names, unpack_array("d", values), strict=True)),
                passes_reused=int(reused),
                passes_resumed=int(resumed),
            )
        else:
            reason, legacy_failure = rest
            self._outcome = Failed(reason=str(reason), legacy=bool(legacy_failure))
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tombstone):
            return NotImplemented
        return self.record() == other.record()

    __hash__ = None  # type: ignore[assignment]

    def digest_at(self, slot: int) -> str | None:
        """The response digest recorded for ``slot`` (None when the slot was empty)."""
        if not 0 <= slot < self.group_size:
            return None
        raw = self._digests[slot * DIGEST_BYTES : (slot + 1) * DIGEST_BYTES]
        return None if raw == _ABSENT else raw.hex()

    @property
    def digests(self) -> dict[int, str]:
        found = ((slot, self.digest_at(slot)) for slot in range(self.group_size))
        return {slot: digest for slot, digest in found if digest is not None}

    @property
    def outcome(self) -> Outcome:
        kept = self._outcome
        return kept.unpack() if isinstance(kept, PackedCompleted) else kept

    @property
    def masked(self) -> bool:
        """True when the judge failed (without unpacking anything)."""
        return isinstance(self._outcome, Masked)

    @property
    def failed(self) -> Failed | None:
        """The failure, without unpacking a completed outcome."""
        return self._outcome if isinstance(self._outcome, Failed) else None
