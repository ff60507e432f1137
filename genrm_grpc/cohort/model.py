"""Core values of the cohort protocol: coordinates, keys, members, outcomes, rejections.

Everything here is transport-free and immutable except :class:`Cohort`, which the
registry owns and mutates.
"""

from __future__ import annotations

import enum
import marshal
import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from genrm_grpc.scoring.types import AnswerTexts, JudgedPair, Verdict


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

    @property
    def explicit(self) -> bool:
        return self.group_id is not None

    @property
    def group_scope(self) -> str | None:
        """The principal's group: what watermarks and supersession are keyed by."""
        if self.group_id is None:
            return None
        return group_scope(self.principal, self.group_id)

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
    #: Passes taken from the verdict journal instead of a judge call: from an earlier
    #: attempt of the group (reused) or from before a restart (resumed).
    passes_reused: int = 0
    passes_resumed: int = 0


def reward_problem(rewards: tuple[MemberReward, ...], group_size: int) -> str | None:
    """Why these rewards must not be published (None when they may): the one rule that
    a result has exactly one finite reward per member."""
    if len(rewards) != group_size:
        return (
            f"aggregation produced {len(rewards)} rewards for {group_size} members; "
            "nothing was published"
        )
    bad = [k for k, r in enumerate(rewards) if not math.isfinite(r.reward)]
    if bad:
        return (
            f"aggregation produced non-finite rewards for members {bad[:20]}; nothing was published"
        )
    return None


@dataclass(frozen=True, slots=True)
class Masked:
    """The judge failed: the cohort completes, every member is masked (reward 0.0)."""

    reason: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    passes_reused: int = 0
    passes_resumed: int = 0


@dataclass(frozen=True, slots=True)
class Failed:
    """The cohort failed before it could be rewarded (deadline, supersession, ...)."""

    reason: str
    legacy: bool = False


Outcome = Completed | Masked | Failed

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


_DIGEST_BYTES = 32
_ABSENT = bytes(_DIGEST_BYTES)


def comparisons_of(member: int, judged: tuple[JudgedPair, ...]) -> tuple[JudgedPair, ...]:
    """The verdicts a member took part in, in aggregation order."""
    return tuple(p for p in judged if member in (p.response_i, p.response_j))


def comparisons_by_member(n: int, judged: tuple[JudgedPair, ...]) -> list[tuple[JudgedPair, ...]]:
    """``comparisons_of`` for every member of ``range(n)`` in one pass, O(len(judged)).

    (Calling ``comparisons_of`` per member is O(n × verdicts): seconds for a large group.)
    """
    found: list[list[JudgedPair]] = [[] for _ in range(n)]
    for pair in judged:
        for member in {pair.response_i, pair.response_j}:
            if 0 <= member < n:
                found[member].append(pair)
    return [tuple(pairs) for pairs in found]


class _PackedCompleted:
    """A Completed outcome packed into flat arrays: no per-member or per-verdict objects.

    Tombstones are retained by the thousand, and a Completed for 16 members is ~100
    small objects (7 KiB, all tracked by the cyclic GC); packed it is a few arrays.
    ``unpack`` rebuilds an equal Completed for a replay.

    Each array is as narrow as its values allow exactly, decided once here from the
    values (so equal outcomes pack to equal bytes): pair indices in one byte each while
    all are below 256, verdict scores in one signed byte each while every one is an
    integer in [-128, 127] (a GenRM verdict's scores and ranking are; -0.0 stays wide),
    each member's reward left out when it is bit for bit its overall score (aggregation
    makes it so), and the metric names the server produces as their index in
    ``_METRIC_NAMES``.
    """

    __slots__ = (
        "failed",
        "judged",
        "member_pairs",
        "member_values",
        "metric_names",
        "metric_values",
        "offsets",
        "pair_index",
        "pair_scores",
        "passes",
        "values_width",
    )

    def __init__(self, outcome: Completed) -> None:
        table: dict[JudgedPair, int] = {}
        for pair in (*outcome.judged, *(p for r in outcome.rewards for p in r.comparisons)):
            table.setdefault(pair, len(table))
        pairs = list(table)
        self.pair_index = _index_array(
            [n for p in pairs for n in (p.response_i, p.response_j, p.judge_index)]
        )
        self.pair_scores = _score_array(
            [x for p in pairs for x in (p.verdict.score_1, p.verdict.score_2, p.verdict.ranking)]
        )
        self.failed = bytes(p.verdict.parse_failed for p in pairs)
        self.judged = _index_array([table[p] for p in outcome.judged])
        values = array(
            "d",
            [
                x
                for r in outcome.rewards
                for x in (r.reward, r.score_raw, r.overall_score, r.length_adjustment)
            ],
        )
        self.values_width = 4
        if values[0::4].tobytes() == values[2::4].tobytes():
            del values[0::4]  # the reward is the overall score: kept once
            self.values_width = 3
        self.member_values = values
        # Each member's comparisons are normally its verdicts in judged order; only when
        # they are not (hand-built outcomes) are they stored explicitly.
        by_member = comparisons_by_member(len(outcome.rewards), outcome.judged)
        derived = all(r.comparisons == by_member[k] for k, r in enumerate(outcome.rewards))
        self.offsets: array[int] | None = None if derived else array("I", [0])
        member_pairs: list[int] = []
        if self.offsets is not None:
            for r in outcome.rewards:
                member_pairs.extend(table[p] for p in r.comparisons)
                self.offsets.append(len(member_pairs))
        self.member_pairs = array("I", member_pairs)
        self.metric_names = _metric_names_field(tuple(outcome.metrics))
        self.metric_values = array("d", outcome.metrics.values())
        self.passes = (outcome.passes_reused, outcome.passes_resumed)

    def to_fields(self) -> tuple[Any, ...]:
        """The packed outcome as atomic values only (bytes, str, None) for a record; the
        first field names the arrays' type codes and the members' value width."""
        return (
            f"{self.pair_index.typecode}{self.pair_scores.typecode}{self.judged.typecode}"
            f"{self.values_width}",
            self.pair_index.tobytes(),
            self.pair_scores.tobytes(),
            self.failed,
            self.judged.tobytes(),
            self.member_values.tobytes(),
            None if self.offsets is None else self.offsets.tobytes(),
            self.member_pairs.tobytes(),
            self.metric_names,
            self.metric_values.tobytes(),
            *self.passes,
        )

    @classmethod
    def from_fields(cls, fields: tuple[Any, ...], version: int) -> _PackedCompleted:
        self = cls.__new__(cls)
        codes = "IdI4"  # versions 1 and 2: every array wide
        if version >= 3:
            codes, *rest = fields
            fields = tuple(rest)
        pairs, scores, failed, judged, values, offsets, members, names, metrics = fields[:9]
        self.passes = (int(fields[9]), int(fields[10])) if len(fields) > 9 else (0, 0)
        self.pair_index = _array(codes[0], pairs)
        self.pair_scores = _array(codes[1], scores)
        self.failed = failed
        self.judged = _array(codes[2], judged)
        self.member_values = _array("d", values)
        self.values_width = int(codes[3])
        self.offsets = None if offsets is None else _array("I", offsets)
        self.member_pairs = _array("I", members)
        self.metric_names = names
        self.metric_values = _array("d", metrics)
        return self

    def unpack(self) -> Completed:
        index, scores = self.pair_index, self.pair_scores
        pairs = [
            JudgedPair(
                index[3 * n],
                index[3 * n + 1],
                index[3 * n + 2],
                Verdict(
                    float(scores[3 * n]),
                    float(scores[3 * n + 1]),
                    float(scores[3 * n + 2]),
                    bool(self.failed[n]),
                ),
            )
            for n in range(len(self.failed))
        ]
        values, offsets, width = self.member_values, self.offsets, self.values_width
        judged = tuple(pairs[n] for n in self.judged)
        members = len(values) // width
        by_member = comparisons_by_member(members, judged) if offsets is None else []

        def comparisons(k: int) -> tuple[JudgedPair, ...]:
            if offsets is None:
                return by_member[k]
            return tuple(pairs[n] for n in self.member_pairs[offsets[k] : offsets[k + 1]])

        # Width 4: (reward, score_raw, overall_score, length_adjustment) per member;
        # width 3: (score_raw, overall_score, length_adjustment), the reward being the
        # overall score.
        first = width - 3  # where score_raw sits
        reward_at = 1 - first  # width 3: the overall score's place
        rewards = tuple(
            MemberReward(
                values[width * k + reward_at],
                values[width * k + first],
                values[width * k + first + 1],
                values[width * k + first + 2],
                comparisons(k),
            )
            for k in range(members)
        )
        names = self.metric_names
        if isinstance(names, bytes):
            names = tuple(_METRIC_NAMES[n] for n in names)
        return Completed(
            rewards=rewards,
            metrics=dict(zip(names, self.metric_values, strict=True)),
            judged=judged,
            passes_reused=self.passes[0],
            passes_resumed=self.passes[1],
        )


def _array(typecode: str, raw: bytes) -> array[Any]:
    packed = array(typecode)
    packed.frombytes(raw)
    return packed


#: Version 2 added the reused/resumed pass counts; version 3 stores the prompt digest
#: raw and narrows a completed outcome's arrays (``_PackedCompleted.to_fields``).
#: Records of versions 1 and 2 still read.
_RECORD_VERSION = 3

#: Metric names a version-3 record stores as their index. Records on disk refer to these
#: positions: append only, never reorder or remove. Other names are stored as text.
_METRIC_NAMES = (
    "mean_individual_score",
    "std_individual_score",
    "tiebreak_usage_rate",
    "genrm_parse_failure_rate_per_group",
    "judge_input_tokens_total",
    "judge_output_tokens_total",
    "judge_reasoning_tokens_total",
    "judge_output_tokens_mean",
    "judge_output_tokens_max",
    "judge_cached_tokens_total",
    "judge_output_tokens_wasted_total",
    "judge_adaptive_budget_cuts",
)
_METRIC_INDEX = {name: n for n, name in enumerate(_METRIC_NAMES)}

#: marshal's format 2 writes no back-references, so equal values always give equal
#: bytes (formats 3 and later refer back to an object met twice, such as the cached
#: one-byte ``bytes``, which would make a record depend on object identity).
_MARSHAL_FORMAT = 2


#: Floats that a verdict score narrows to one signed byte from (exactly).
_SMALL_INTEGERS = frozenset(float(n) for n in range(-128, 128))


def _index_array(values: list[int]) -> array[int]:
    """Unsigned indices: one byte each when all fit ("B"), else four ("I")."""
    return array("B" if not values or max(values) < 256 else "I", values)


def _score_array(values: list[float]) -> array[Any]:
    """Scores: one signed byte each ("b") when that is exact bit for bit, else "d"."""
    if _SMALL_INTEGERS.issuperset(values) and (
        0.0 not in values or all(math.copysign(1.0, x) > 0 for x in values if x == 0.0)
    ):
        return array("b", map(int, values))
    return array("d", values)


def _metric_names_field(names: tuple[str, ...]) -> bytes | tuple[str, ...]:
    index = _METRIC_INDEX
    if len(names) < 256 and all(name in index for name in names):
        return bytes(index[name] for name in names)
    return tuple(str(name) for name in names)


def _digest_field(digest: str) -> bytes | str:
    """A hex SHA-256 digest as its 32 raw bytes (any other text as it is)."""
    if len(digest) == 2 * _DIGEST_BYTES:
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            return digest
        if raw.hex() == digest:
            return raw
    return digest


class Tombstone:
    """What a terminal cohort leaves behind: digests and outcome, never answer bodies.

    Stored compactly (raw digests in one ``bytes``, a completed outcome packed into
    arrays, see ``_PackedCompleted``) because thousands are retained; the accessors
    rebuild the plain values. A store keeps it as ``record()``, one immutable ``bytes``
    that the cyclic garbage collector does not track, so tens of thousands of retained
    cohorts add nothing to a full collection (a Tombstone object with its arrays is
    about ten tracked objects); ``from_record`` rebuilds it for a lookup.
    """

    __slots__ = ("_digests", "_outcome", "finished_at", "group_size", "key", "prompt_digest")

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
            packed[slot * _DIGEST_BYTES : (slot + 1) * _DIGEST_BYTES] = bytes.fromhex(digest)
        self._digests = bytes(packed)
        self._outcome: _PackedCompleted | Masked | Failed = (
            _PackedCompleted(outcome) if isinstance(outcome, Completed) else outcome
        )

    def record(self) -> bytes:
        """This tombstone as one ``bytes`` (not tracked by the cyclic GC); see from_record."""
        kept = self._outcome
        outcome: tuple[Any, ...]
        if isinstance(kept, _PackedCompleted):
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
                _RECORD_VERSION,
                key.group_id,
                key.legacy_key,
                key.attempt,
                key.principal,
                self.group_size,
                _digest_field(self.prompt_digest),
                self.finished_at,
                self._digests,
                *outcome,
            ),
            _MARSHAL_FORMAT,
        )

    @classmethod
    def from_record(cls, record: bytes) -> Tombstone:
        """The tombstone that ``record()`` packed."""
        (version, gid, legacy, attempt, principal, size, prompt, finished, digests, kind, *rest) = (
            marshal.loads(record)
        )
        if version not in (1, 2, _RECORD_VERSION):
            raise ValueError(f"unknown tombstone record version {version}")
        self = cls.__new__(cls)
        self.key = CohortKey(gid, legacy, attempt, principal)
        self.group_size = size
        self.prompt_digest = prompt.hex() if isinstance(prompt, bytes) else prompt
        self.finished_at = finished
        self._digests = digests
        if kind == "c":
            self._outcome = _PackedCompleted.from_fields(tuple(rest), version)
        elif kind == "m":
            reason, names, values, *passes = rest
            reused, resumed = passes if passes else (0, 0)
            self._outcome = Masked(
                reason=str(reason),
                metrics=dict(zip(names, _array("d", values), strict=True)),
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
        raw = self._digests[slot * _DIGEST_BYTES : (slot + 1) * _DIGEST_BYTES]
        return None if raw == _ABSENT else raw.hex()

    @property
    def digests(self) -> dict[int, str]:
        found = ((slot, self.digest_at(slot)) for slot in range(self.group_size))
        return {slot: digest for slot, digest in found if digest is not None}

    @property
    def outcome(self) -> Outcome:
        kept = self._outcome
        return kept.unpack() if isinstance(kept, _PackedCompleted) else kept

    @property
    def masked(self) -> bool:
        """True when the judge failed (without unpacking anything)."""
        return isinstance(self._outcome, Masked)

    @property
    def failed(self) -> Failed | None:
        """The failure, without unpacking a completed outcome."""
        return self._outcome if isinstance(self._outcome, Failed) else None
