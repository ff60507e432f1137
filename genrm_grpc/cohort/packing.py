"""A completed outcome packed into flat arrays, and the record format of a tombstone.

``genrm_grpc.cohort.model.Tombstone`` keeps a completed outcome as a ``PackedCompleted``
and writes itself as one ``marshal`` record (``RECORD_VERSION``, ``MARSHAL_FORMAT``); the
packing and the narrow encodings are here, apart from the cohort's plain values.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from genrm_grpc.cohort.outcome import Completed, MemberReward, comparisons_by_member
from genrm_grpc.scoring.types import JudgedPair, Verdict

DIGEST_BYTES = 32
"""A SHA-256 digest's raw length."""


class PackedCompleted:
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
    def from_fields(cls, fields: tuple[Any, ...], version: int) -> PackedCompleted:
        self = cls.__new__(cls)
        codes = "IdI4"  # versions 1 and 2: every array wide
        if version >= 3:
            codes, *rest = fields
            fields = tuple(rest)
        pairs, scores, failed, judged, values, offsets, members, names, metrics = fields[:9]
        self.passes = (int(fields[9]), int(fields[10])) if len(fields) > 9 else (0, 0)
        self.pair_index = unpack_array(codes[0], pairs)
        self.pair_scores = unpack_array(codes[1], scores)
        self.failed = failed
        self.judged = unpack_array(codes[2], judged)
        self.member_values = unpack_array("d", values)
        self.values_width = int(codes[3])
        self.offsets = None if offsets is None else unpack_array("I", offsets)
        self.member_pairs = unpack_array("I", members)
        self.metric_names = names
        self.metric_values = unpack_array("d", metrics)
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


def unpack_array(typecode: str, raw: bytes) -> array[Any]:
    packed = array(typecode)
    packed.frombytes(raw)
    return packed


#: Version 2 added the reused/resumed pass counts; version 3 stores the prompt digest
#: raw and narrows a completed outcome's arrays (``PackedCompleted.to_fields``).
#: Records of versions 1 and 2 still read.
RECORD_VERSION = 3

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
MARSHAL_FORMAT = 2


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


def digest_field(digest: str) -> bytes | str:
    """A hex SHA-256 digest as its 32 raw bytes (any other text as it is)."""
    if len(digest) == 2 * DIGEST_BYTES:
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            return digest
        if raw.hex() == digest:
            return raw
    return digest
