"""What a cohort's evaluation ends in: rewards (``Completed``), a masked group
(``Masked``) or a failure (``Failed``), and the rule that rewards may be published.

Transport-free and immutable, like the rest of ``genrm_grpc.cohort.model``, which
re-exports every name here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from genrm_grpc.scoring.types import JudgedPair


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
