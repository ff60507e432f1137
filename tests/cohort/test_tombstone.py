"""Tombstones pack their outcome and digests; what they give back equals what went in."""

from __future__ import annotations

import gc
import hashlib
import marshal
import math
from array import array

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
    score = finite | st.integers(-130, 130).map(float)
    verdict = st.builds(Verdict, score, score, score, st.booleans())
    index = st.integers(0, size) | st.integers(250, 70_000)
    pair = st.builds(JudgedPair, index, index, st.integers(0, 3), verdict)
    judged = tuple(draw(st.lists(pair, max_size=8)))
    same = draw(st.booleans())  # aggregation's rewards are their overall scores
    rewards = []
    for k in range(size):
        overall = draw(finite)
        rewards.append(
            MemberReward(
                overall if same else draw(finite),
                draw(finite),
                overall,
                draw(finite),
                tuple(p for p in judged if k in (p.response_i, p.response_j)),
            )
        )
    names = st.sampled_from(["mean", "x", "mean_individual_score", "judge_output_tokens_max"])
    metrics = draw(st.dictionaries(names, finite))
    return Completed(rewards=tuple(rewards), metrics=metrics, judged=judged)


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


def test_a_completed_16_member_tombstone_packs_into_a_compact_record() -> None:
    """What aggregation produces (integer verdict scores, reward = overall score, the
    known metric names, a hex prompt digest) is stored narrow: 1,215 bytes, not 1,970."""
    judged = tuple(
        JudgedPair(k, (k + 1) % 16, 0, Verdict(float(1 + k % 5), 3.0, float(1 + k % 6)))
        for k in range(16)
    )
    by_member = [tuple(p for p in judged if k in (p.response_i, p.response_j)) for k in range(16)]
    rewards = tuple(
        MemberReward(3.0 + k / 7, 3.0 + k / 9, 3.0 + k / 7, -k / 11, by_member[k])
        for k in range(16)
    )
    metrics = {
        "mean_individual_score": 3.1,
        "std_individual_score": 0.9,
        "tiebreak_usage_rate": 0.0,
        "genrm_parse_failure_rate_per_group": 0.0,
    }
    outcome = Completed(rewards=rewards, metrics=metrics, judged=judged)
    digests = {k: hashlib.sha256(bytes([k])).hexdigest() for k in range(16)}
    prompt = hashlib.sha256(b"prompt").hexdigest()
    tomb = Tombstone(CohortKey("group-0", None, 0), 16, prompt, digests, outcome, 1.5)
    record = tomb.record()
    assert len(record) <= 1_250
    back = Tombstone.from_record(record)
    assert back == tomb and back.outcome == outcome and back.prompt_digest == prompt
    assert back.digests == digests


def test_values_that_do_not_narrow_exactly_are_kept_whole() -> None:
    """-0.0, fractional and large scores, indices above 255, a reward that is not the
    overall score and an unknown metric come back bit for bit."""
    pair = JudgedPair(0, 300, 2, Verdict(-0.0, 2.5, 1000.0))
    small = JudgedPair(1, 0, 0, Verdict(-0.0, 4.0, 2.0))
    rewards = (
        MemberReward(1.0, 2.0, -0.0, 0.5, (pair, small)),
        MemberReward(0.0, 2.0, 0.0, 0.5, (small,)),
    )
    outcome = Completed(rewards=rewards, metrics={"custom": -0.0}, judged=(pair, small))
    back = Tombstone.from_record(Tombstone(KEY, 2, "p", {}, outcome, 0.0).record()).outcome
    assert back == outcome
    assert isinstance(back, Completed)
    assert math.copysign(1.0, back.judged[0].verdict.score_1) == -1.0
    assert math.copysign(1.0, back.rewards[0].overall_score) == -1.0
    assert math.copysign(1.0, back.metrics["custom"]) == -1.0
    # Integer scores alone narrow, and keep their sign of zero only when it is +0.0.
    only_small = Completed(
        rewards=rewards[1:], judged=(JudgedPair(0, 0, 0, Verdict(0.0, 5.0, 1.0)),)
    )
    again = Tombstone.from_record(Tombstone(KEY, 1, "p", {}, only_small, 0.0).record()).outcome
    assert again == only_small
    assert isinstance(again, Completed)
    verdict = again.judged[0].verdict
    assert all(isinstance(x, float) for x in (verdict.score_1, verdict.score_2, verdict.ranking))


def test_a_version_2_record_still_reads() -> None:
    """A record as the previous server wrote it (hex prompt digest, wide arrays)."""
    pair = JudgedPair(0, 1, 0, Verdict(4.0, 2.0, 2.0))
    old = marshal.dumps(
        (
            2,
            "g",
            None,
            0,
            "",
            1,
            "ab" * 32,
            7.5,
            bytes(32),
            "c",
            array("I", [0, 1, 0]).tobytes(),
            array("d", [4.0, 2.0, 2.0]).tobytes(),
            b"\x00",
            array("I", [0]).tobytes(),
            array("d", [4.0, 4.0, 4.0, 0.0]).tobytes(),
            None,
            b"",
            ("mean_individual_score",),
            array("d", [3.0]).tobytes(),
            1,
            0,
        )
    )
    back = Tombstone.from_record(old)
    assert back.key == KEY and back.prompt_digest == "ab" * 32 and back.finished_at == 7.5
    assert back.outcome == Completed(
        rewards=(MemberReward(4.0, 4.0, 4.0, 0.0, (pair,)),),
        metrics={"mean_individual_score": 3.0},
        judged=(pair,),
        passes_reused=1,
    )
