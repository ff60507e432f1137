"""Tombstones pack their outcome and digests; what they give back equals what went in."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_grpc.cohort.model import (
    CohortKey,
    Completed,
    Failed,
    Masked,
    MemberReward,
    Tombstone,
)
from genrm_grpc.scoring.types import JudgedPair, Verdict

KEY = CohortKey("g", None, 0)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def completed_outcomes(draw: st.DrawFn) -> Completed:
    size = draw(st.integers(1, 6))
    verdict = st.builds(Verdict, finite, finite, finite, st.booleans())
    pair = st.builds(
        JudgedPair, st.integers(0, size), st.integers(0, size), st.integers(0, 3), verdict
    )
    judged = tuple(draw(st.lists(pair, max_size=8)))
    rewards = tuple(
        MemberReward(
            draw(finite),
            draw(finite),
            draw(finite),
            draw(finite),
            tuple(p for p in judged if k in (p.response_i, p.response_j)),
        )
        for k in range(size)
    )
    metrics = draw(st.dictionaries(st.sampled_from(["mean", "std", "rate", "x"]), finite))
    return Completed(rewards=rewards, metrics=metrics, judged=judged)


@settings(max_examples=150, deadline=None)
@given(completed_outcomes())
def test_a_completed_outcome_comes_back_equal_after_packing(outcome: Completed) -> None:
    tomb = Tombstone(KEY, len(outcome.rewards), "p" * 64, {}, outcome, 0.0)
    assert tomb.outcome == outcome
    assert tomb.failed is None


def test_comparisons_outside_the_judged_list_are_kept_too() -> None:
    pair = JudgedPair(0, 1, 0, Verdict(4.0, 2.0, 2.0))
    outcome = Completed(rewards=(MemberReward(4.0, 4.0, 4.0, 0.0, (pair,)),), judged=())
    assert Tombstone(KEY, 1, "p", {}, outcome, 0.0).outcome == outcome


def test_digests_come_back_per_slot_and_empty_slots_stay_empty() -> None:
    digests = {k: hashlib.sha256(bytes([k])).hexdigest() for k in (0, 2)}
    tomb = Tombstone(KEY, 4, "p", digests, Failed("deadline"), 0.0)
    assert tomb.digests == digests
    assert [tomb.digest_at(k) for k in range(-1, 5)] == [
        None,
        digests[0],
        None,
        digests[2],
        None,
        None,
    ]
    assert tomb.failed == Failed("deadline") and tomb.outcome == Failed("deadline")
    masked = Tombstone(KEY, 1, "p", {}, Masked("judge down"), 0.0)
    assert masked.outcome == Masked("judge down") and masked.failed is None


def test_comparisons_by_member_equals_comparisons_of_for_every_member() -> None:
    from genrm_grpc.cohort.model import comparisons_by_member, comparisons_of
    from genrm_grpc.scoring import judge_passes
    from genrm_grpc.scoring.types import JudgedPair, Verdict

    for n in range(1, 9):
        for strategy in ("circular", "all_pairs"):
            judged = tuple(
                JudgedPair(i, j, k, Verdict(float(i), float(j), 3.5))
                for i, j, k in judge_passes(n, strategy, 2)  # type: ignore[arg-type]
            )
            assert comparisons_by_member(n, judged) == [comparisons_of(k, judged) for k in range(n)]
