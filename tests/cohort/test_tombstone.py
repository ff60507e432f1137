"""Tombstones pack their outcome and digests; what they give back equals what went in."""

from __future__ import annotations

import gc
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
from genrm_grpc.config import Settings
from genrm_grpc.scoring.types import JudgedPair, Verdict
from genrm_grpc.store.memory import MemoryStore

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


@settings(max_examples=100, deadline=None)
@given(completed_outcomes())
def test_a_tombstone_comes_back_equal_from_its_stored_record(outcome: Completed) -> None:
    digests = {0: hashlib.sha256(b"a").hexdigest()}
    tomb = Tombstone(KEY, len(outcome.rewards), "p" * 64, digests, outcome, 12.5)
    back = Tombstone.from_record(tomb.record())
    assert back == tomb
    assert (back.key, back.group_size, back.prompt_digest, back.finished_at) == (
        KEY,
        len(outcome.rewards),
        "p" * 64,
        12.5,
    )
    assert back.digests == digests and back.outcome == outcome


def test_masked_and_failed_tombstones_come_back_from_their_records() -> None:
    legacy = CohortKey(None, "task-3:abc", 2)
    for key, outcome in (
        (KEY, Masked("judge down", {"judge_failures": 3.0})),
        (KEY, Failed("deadline")),
        (legacy, Failed("superseded", legacy=True)),
    ):
        back = Tombstone.from_record(Tombstone(key, 2, "p", {}, outcome, 1.0).record())
        assert back.key == key and back.outcome == outcome


def test_retained_tombstones_leave_nothing_for_the_cyclic_gc_to_walk() -> None:
    """A full collection walks every tracked object: retained cohorts must add none."""
    outcome = Completed(
        rewards=tuple(MemberReward(3.0, 3.0, 3.0, 0.0) for _ in range(4)),
        metrics={"mean": 3.0},
        judged=tuple(JudgedPair(k, (k + 1) % 4, 0, Verdict(4.0, 3.0, 3.0)) for k in range(4)),
    )
    digests = {k: hashlib.sha256(bytes([k])).hexdigest() for k in range(4)}
    store = MemoryStore(Settings(cohort_result_ttl_s=1e9, max_terminal_cohorts=10_000))
    gc.collect()
    before = len(gc.get_objects())
    for n in range(2_000):
        key = CohortKey(f"g-{n}", None, 0)
        store.put_tombstone(Tombstone(key, 4, "p" * 64, digests, outcome, 1.0), 1.0)
    gc.collect()
    added = len(gc.get_objects()) - before
    assert store.counts()["tombstones"] == 2_000
    assert added < 20, f"{added} tracked objects for 2,000 retained tombstones"
    found = store.tombstone(CohortKey("g-7", None, 0), 2.0)
    assert found is not None and found.outcome == outcome and found.digests == digests


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


def test_tombstones_of_two_principals_with_the_same_group_id_never_meet() -> None:
    store = MemoryStore(Settings(cohort_result_ttl_s=60.0, max_terminal_cohorts=10))
    alice = CohortKey("shared-id", None, 0, "alice")
    bob = CohortKey("shared-id", None, 0, "bob")
    store.put_tombstone(Tombstone(alice, 1, "p", {}, Failed("alice's"), 1.0), 1.0)
    assert store.tombstone(bob, 2.0) is None
    found = store.tombstone(alice, 2.0)
    assert found is not None and found.key == alice and found.outcome == Failed("alice's")
