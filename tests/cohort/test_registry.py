"""The sans-IO cohort registry against the member-submission rules of docs/protocol.md.

One test per row of the table and per "edge rule", named after the behaviour. No
event loop and no clock: every call gets ``now`` explicitly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from genrm_grpc.cohort.identity import CandidateInput
from genrm_grpc.cohort.model import (
    LEGACY_RETRY_ADVICE,
    CandidateSpec,
    Cohort,
    CohortKey,
    Failed,
    Masked,
    Member,
    Phase,
    PromptSpec,
    Reason,
    Rejection,
    Tombstone,
)
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, SubmitDecision
from genrm_grpc.config import Settings
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.memory import MemoryStore

from .support import (
    COLLECTION_S,
    EVALUATION_S,
    OTHER_PROMPT,
    PROMPT,
    T0,
    answer,
    completed,
    fill,
    registry,
    resolve_member,
    sub,
    walk,
)


def rejected(decision: SubmitDecision, reason: Reason) -> Rejection:
    assert decision.disposition is Disposition.REJECTED, decision
    assert decision.rejection is not None
    assert decision.rejection.reason is reason, decision.rejection
    assert decision.cohort is None and decision.replay is None
    return decision.rejection


def complete(reg: CohortRegistry, now: float, **kw: Any) -> Cohort:
    cohort = fill(reg, now, **kw)
    assert reg.evaluation_finished(cohort, completed(cohort.group_size), now)
    assert cohort.phase is Phase.COMPLETED
    return cohort


# ---------------------------------------------------------------- accepted / frozen


def test_new_slot_while_collecting_is_accepted() -> None:
    reg, _ = registry()
    first = reg.submit(sub(0), T0)
    assert first.disposition is Disposition.ACCEPTED
    assert first.cohort is not None and not first.frozen and first.ended == []
    cohort = first.cohort
    assert cohort.phase is Phase.COLLECTING
    assert cohort.collection_deadline == T0 + COLLECTION_S
    assert cohort.evaluation_deadline is None and cohort.snapshot is None

    second = reg.submit(sub(2), T0 + 1)
    assert second.disposition is Disposition.ACCEPTED and second.cohort is cohort
    assert not second.frozen
    assert sorted(cohort.members) == [0, 2]
    assert reg.active_count() == 1
    assert {k: m.candidate.digest for k, m in cohort.members.items()} == {
        0: sub(0).candidate.digest,
        2: sub(2).candidate.digest,
    }


def test_filling_the_last_slot_freezes_the_cohort() -> None:
    reg, _ = registry()
    reg.submit(sub(2), T0)
    reg.submit(sub(0), T0 + 1)
    last = reg.submit(sub(1), T0 + 2)
    assert last.disposition is Disposition.ACCEPTED and last.frozen
    cohort = last.cohort
    assert cohort is not None
    assert cohort.phase is Phase.EVALUATING
    assert cohort.evaluation_deadline == T0 + 2 + EVALUATION_S
    assert cohort.snapshot is not None
    # The snapshot is in slot order, whatever the arrival order.
    assert [m.coords.rollout_index for m in cohort.snapshot] == [0, 1, 2]
    assert [m.candidate.texts.answer for m in cohort.snapshot] == [answer(i) for i in range(3)]
    assert isinstance(cohort.snapshot, tuple)


# ---------------------------------------------------------------- attach / replay


@pytest.mark.parametrize("phase", [Phase.COLLECTING, Phase.EVALUATING])
def test_identical_resubmission_of_an_active_member_attaches(phase: Phase) -> None:
    reg, _ = registry()
    cohort = fill(reg, T0) if phase is Phase.EVALUATING else reg.submit(sub(0), T0).cohort
    assert cohort is not None and cohort.phase is phase
    members_before = dict(cohort.members)

    again = reg.submit(sub(0), T0 + 5)
    assert again.disposition is Disposition.ATTACHED
    assert again.cohort is cohort and not again.frozen and again.ended == []
    assert cohort.members == members_before
    assert cohort.phase is phase


def test_identical_resubmission_after_an_explicit_cohort_completed_replays() -> None:
    reg, store = registry()
    cohort = complete(reg, T0)
    assert reg.active(cohort.key) is None
    assert cohort.members == {} and cohort.snapshot is None

    for i in range(3):
        replay = reg.submit(sub(i), T0 + 10)
        assert replay.disposition is Disposition.REPLAYED
        assert replay.cohort is None and replay.rejection is None
        tomb = replay.replay
        assert tomb is not None and tomb == store.tombstone(cohort.key, T0 + 10)
        assert tomb.outcome == completed(3)
        assert tomb.digests[i] == sub(i).candidate.digest
    assert reg.active_count() == 0


def test_identical_resubmission_after_a_masked_cohort_replays_the_mask() -> None:
    reg, _ = registry()
    cohort = fill(reg, T0)
    assert reg.judge_failed(cohort, "judge down", T0 + 1)
    assert cohort.phase is Phase.COMPLETED
    replay = reg.submit(sub(1), T0 + 2)
    assert replay.disposition is Disposition.REPLAYED
    assert replay.replay is not None and replay.replay.outcome == Masked("judge down")


# ---------------------------------------------------------------- slot conflict


@pytest.mark.parametrize("phase", ["collecting", "evaluating", "completed", "failed"])
def test_a_different_response_for_a_filled_slot_is_slot_conflict(phase: str) -> None:
    reg, _ = registry()
    if phase == "collecting":
        reg.submit(sub(0), T0)
    elif phase == "evaluating":
        fill(reg, T0)
    elif phase == "completed":
        complete(reg, T0)
    else:
        cohort = reg.submit(sub(0), T0).cohort
        assert cohort is not None and reg.fail(cohort, "operator cancelled", T0)

    conflict = reg.submit(sub(0, text="a different answer"), T0 + 1)
    rejection = rejected(conflict, Reason.SLOT_CONFLICT)
    assert rejection.metadata == {"groupId": "g", "groupAttempt": "0", "rolloutIndex": "0"}
    # The reasoning text alone also makes a different payload.
    other = sub(0, candidate=CandidateInput(output_text=answer(0), reasoning_text="other"))
    rejected(reg.submit(other, T0 + 1), Reason.SLOT_CONFLICT)


def test_slot_conflict_does_not_disturb_the_member_in_the_slot() -> None:
    reg, _ = registry()
    cohort = reg.submit(sub(0), T0).cohort
    assert cohort is not None
    rejected(reg.submit(sub(0, text="other"), T0), Reason.SLOT_CONFLICT)
    assert cohort.members[0].candidate.digest == sub(0).candidate.digest
    assert reg.submit(sub(0), T0).disposition is Disposition.ATTACHED


# ---------------------------------------------------------------- closed


def test_every_slot_of_an_evaluating_cohort_is_taken_so_members_attach_or_conflict() -> None:
    """Slots are exactly [0, group_size): an evaluating cohort has no free slot.

    A member with the right prompt and size therefore either attaches or conflicts;
    COHORT_CLOSED is the defensive answer for a slot that is free in a closed cohort.
    """
    reg, _ = registry()
    cohort = fill(reg, T0)
    for i in range(3):
        assert reg.submit(sub(i), T0 + 1).disposition is Disposition.ATTACHED
        rejected(reg.submit(sub(i, text="x"), T0 + 1), Reason.SLOT_CONFLICT)
    # A closed cohort with a free slot (only constructible by hand) refuses it.
    cohort.members.pop(2)
    closed = rejected(reg.submit(sub(2), T0 + 1), Reason.COHORT_CLOSED)
    assert "evaluating" in closed.message


def test_new_slot_after_completion_is_cohort_closed() -> None:
    reg, store = registry()
    key = sub(0).key
    # A completed tombstone that recorded only some slots (defensive branch).
    store.put_tombstone(
        Tombstone(key, 3, sub(0).prompt_digest, {0: sub(0).candidate.digest}, completed(3), T0),
        T0,
    )
    store.raise_watermark(key.group_scope or "", 0, T0)
    closed = rejected(reg.submit(sub(1), T0 + 1), Reason.COHORT_CLOSED)
    assert "completed" in closed.message
    assert reg.submit(sub(0), T0 + 1).disposition is Disposition.REPLAYED


# ---------------------------------------------------------------- prompt mismatch


@pytest.mark.parametrize("phase", ["collecting", "evaluating", "completed", "failed"])
def test_a_different_prompt_is_prompt_mismatch(phase: str) -> None:
    reg, _ = registry()
    if phase == "collecting":
        reg.submit(sub(0), T0)
    elif phase == "evaluating":
        fill(reg, T0)
    elif phase == "completed":
        complete(reg, T0)
    else:
        reg.submit(sub(0), T0)
        reg.submit(sub(1), T0 + COLLECTION_S)  # the deadline has passed: fails the cohort
    now = T0 + COLLECTION_S + 1 if phase == "failed" else T0 + 1
    for i in (0, 1):
        rejection = rejected(reg.submit(sub(i, prompt=OTHER_PROMPT), now), Reason.PROMPT_MISMATCH)
        assert "prompt" in rejection.message
    principle = PromptSpec(PROMPT.messages, principle="be kind")
    rejected(reg.submit(sub(0, prompt=principle), now), Reason.PROMPT_MISMATCH)


@pytest.mark.parametrize("phase", ["collecting", "evaluating", "completed"])
def test_a_different_group_size_is_prompt_mismatch(phase: str) -> None:
    reg, _ = registry()
    if phase == "collecting":
        reg.submit(sub(0), T0)
    elif phase == "evaluating":
        fill(reg, T0)
    else:
        complete(reg, T0)
    rejection = rejected(reg.submit(sub(0, size=4), T0 + 1), Reason.PROMPT_MISMATCH)
    assert "group_size 4" in rejection.message
    rejected(reg.submit(sub(1, size=2), T0 + 1), Reason.PROMPT_MISMATCH)


def test_a_legacy_member_with_a_different_group_size_is_prompt_mismatch() -> None:
    reg, _ = registry()
    reg.submit(sub(0, gid=None, task_index=7), T0)
    rejected(reg.submit(sub(1, gid=None, task_index=7, size=5), T0), Reason.PROMPT_MISMATCH)
    # The default group size is what an absent group_size means.
    rejected(
        reg.submit(sub(1, gid=None, task_index=7, size=None, default_group_size=4), T0),
        Reason.PROMPT_MISMATCH,
    )
    ok = reg.submit(sub(1, gid=None, task_index=7, size=None, default_group_size=3), T0)
    assert ok.disposition is Disposition.ACCEPTED


def test_a_legacy_member_with_a_different_prompt_is_a_different_cohort() -> None:
    reg, _ = registry()
    a = reg.submit(sub(0, gid=None, task_index=7), T0).cohort
    b = reg.submit(sub(0, gid=None, task_index=7, prompt=OTHER_PROMPT), T0).cohort
    assert a is not None and b is not None and a.key != b.key
    assert reg.active_count() == 2


# ---------------------------------------------------------------- attempts


def test_an_attempt_below_the_watermark_is_attempt_superseded() -> None:
    reg, _ = registry()
    reg.submit(sub(0, attempt=3), T0)
    for attempt in (0, 2):
        rejection = rejected(reg.submit(sub(1, attempt=attempt), T0 + 1), Reason.ATTEMPT_SUPERSEDED)
        assert rejection.metadata == {
            "groupId": "g",
            "groupAttempt": str(attempt),
            "rolloutIndex": "1",
            "latestAttempt": "3",
        }
    assert reg.latest_attempt("g", T0 + 1) == 3


def test_a_newer_attempt_supersedes_older_active_attempts_and_becomes_the_watermark() -> None:
    reg, store = registry()
    old = reg.submit(sub(0, attempt=0), T0).cohort
    assert old is not None
    new = reg.submit(sub(0, attempt=2, text="regenerated"), T0 + 1)
    assert new.disposition is Disposition.ACCEPTED
    assert new.ended == [old]
    assert old.phase is Phase.FAILED
    assert isinstance(old.outcome, Failed)
    assert "superseded by attempt 2" in old.outcome.reason and not old.outcome.legacy
    assert old.members == {} and old.snapshot is None
    assert reg.latest_attempt("g", T0 + 1) == 2
    assert reg.active(old.key) is None and reg.active_count() == 1
    # The superseded attempt is fenced, also for identical members and new slots.
    rejected(reg.submit(sub(0, attempt=0), T0 + 2), Reason.ATTEMPT_SUPERSEDED)
    rejected(reg.submit(sub(1, attempt=1), T0 + 2), Reason.ATTEMPT_SUPERSEDED)
    tomb = store.tombstone(old.key, T0 + 2)
    assert tomb is not None and isinstance(tomb.outcome, Failed)


def test_a_newer_attempt_supersedes_an_evaluating_attempt() -> None:
    reg, _ = registry()
    old = fill(reg, T0, attempt=0)
    new = reg.submit(sub(0, attempt=1), T0 + 1)
    assert new.ended == [old] and old.phase is Phase.FAILED
    # The old evaluation's result arrives late and is discarded.
    assert not reg.evaluation_finished(old, completed(3), T0 + 2)
    assert isinstance(old.outcome, Failed)
    assert new.cohort is not None and new.cohort.phase is Phase.COLLECTING


def test_an_absent_group_attempt_is_attempt_zero() -> None:
    reg, _ = registry()
    absent = reg.submit(sub(0, attempt=None), T0)
    assert absent.cohort is not None
    assert absent.cohort.key == CohortKey(group_id="g", legacy_key=None, attempt=0)
    assert reg.submit(sub(0, attempt=0), T0).disposition is Disposition.ATTACHED
    assert reg.submit(sub(1, attempt=None), T0).cohort is absent.cohort


def test_an_absent_group_attempt_logs_one_migration_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg, _ = registry()
    with caplog.at_level(logging.WARNING, logger="genrm_grpc.cohort.registry"):
        reg.submit(sub(0, attempt=None), T0)
        reg.submit(sub(1, attempt=None), T0)
        reg.submit(sub(0, gid="h", attempt=None), T0)
    warnings = [r for r in caplog.records if "group_attempt" in r.getMessage()]
    assert len(warnings) == 1


# ---------------------------------------------------------------- failed cohorts


def test_a_failed_cohort_answers_later_members_with_cohort_failed_and_the_reason() -> None:
    reg, _ = registry()
    cohort = reg.submit(sub(0), T0).cohort
    assert cohort is not None
    assert reg.fail(cohort, "cancelled by the operator", T0 + 1)
    assert not reg.fail(cohort, "again", T0 + 2)
    for member in (sub(0), sub(1)):  # identical member, and a slot never filled
        rejection = rejected(reg.submit(member, T0 + 2), Reason.COHORT_FAILED)
        assert "cancelled by the operator" in rejection.message
        assert LEGACY_RETRY_ADVICE not in rejection.message
        assert rejection.metadata["groupId"] == "g"


def test_a_failed_legacy_cohort_advises_a_fresh_group_id() -> None:
    reg, store = registry()
    legacy = sub(0, gid=None, task_index=5)
    cohort = reg.submit(legacy, T0).cohort
    assert cohort is not None
    assert reg.collection_deadline(cohort, T0 + COLLECTION_S)
    assert isinstance(cohort.outcome, Failed) and cohort.outcome.legacy
    for member in (legacy, sub(1, gid=None, task_index=5)):
        rejection = rejected(reg.submit(member, T0 + COLLECTION_S + 1), Reason.COHORT_FAILED)
        assert "collection deadline expired" in rejection.message
        assert LEGACY_RETRY_ADVICE in rejection.message
        assert "groupId" not in rejection.metadata
    tomb = store.tombstone(cohort.key, T0 + COLLECTION_S + 1)
    assert tomb is not None and isinstance(tomb.outcome, Failed) and tomb.outcome.legacy


def test_a_legacy_cohort_cancelled_by_fail_also_carries_the_advice() -> None:
    reg, _ = registry()
    cohort = fill(reg, T0, gid=None, prompt_id="p-1")
    assert reg.fail(cohort, "server is shutting down", T0)
    rejection = rejected(reg.submit(sub(0, gid=None, prompt_id="p-1"), T0), Reason.COHORT_FAILED)
    assert "server is shutting down" in rejection.message
    assert LEGACY_RETRY_ADVICE in rejection.message


def test_a_completed_legacy_cohort_is_retired_at_once() -> None:
    reg, store = registry()
    first = complete(reg, T0, gid=None, task_index=9)
    assert store.tombstone(first.key, T0) is None
    assert store.counts()["tombstones"] == 0
    again = reg.submit(sub(0, gid=None, task_index=9), T0 + 1)
    assert again.disposition is Disposition.ACCEPTED
    assert again.cohort is not None and again.cohort is not first
    assert again.cohort.key == first.key and again.cohort.seq > first.seq
    assert again.cohort.phase is Phase.COLLECTING


# ---------------------------------------------------------------- invalid members


INVALID_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "rollout_index equal to group_size": ({"i": 3, "size": 3}, "member.rollout_index"),
    "negative rollout_index": ({"i": -1}, "member.rollout_index"),
    "rollout_index outside the default size": (
        {"i": 3, "size": None, "default_group_size": 3},
        "member.rollout_index",
    ),
    "group_size zero": ({"size": 0}, "member.group_size"),
    "blank group_id": ({"gid": "  "}, "member.group_id"),
    "empty group_id": ({"gid": ""}, "member.group_id"),
    "overlong group_id": ({"gid": "g" * 513}, "member.group_id"),
    "both candidate forms": (
        {"candidate": CandidateInput(output_text="x", responses_api_json='{"output": []}')},
        "candidate",
    ),
    "responses_api_json not JSON": (
        {"candidate": CandidateInput(responses_api_json="{not json")},
        "candidate.responses_api_json",
    ),
    "responses_api_json not an object": (
        {"candidate": CandidateInput(responses_api_json="[1, 2]")},
        "candidate.responses_api_json",
    ),
    "responses_api_json with NaN": (
        {"candidate": CandidateInput(responses_api_json='{"output": NaN}')},
        "candidate.responses_api_json",
    ),
    "baseline in rollout_cohort mode": (
        {"prompt": PromptSpec(PROMPT.messages, baseline_response="base")},
        "prompt.baseline_response",
    ),
    "no baseline in fixed_baseline mode": ({"mode": "fixed_baseline"}, "prompt.baseline_response"),
    "empty conversation": ({"prompt": PromptSpec(())}, "prompt.messages"),
}


@pytest.mark.parametrize("case", sorted(INVALID_CASES))
def test_bad_coordinates_are_invalid_member_with_field_violations(case: str) -> None:
    kwargs, field_name = INVALID_CASES[case]
    kwargs = dict(kwargs)
    i = kwargs.pop("i", 0)
    got = resolve_member(i, **kwargs)
    assert isinstance(got, Rejection), got
    assert got.reason is Reason.INVALID_MEMBER
    assert [f for f, _ in got.field_violations] == [field_name]
    assert all(description for _, description in got.field_violations)


def test_valid_edge_coordinates_resolve() -> None:
    assert sub(0, size=1).group_size == 1
    assert sub(4095, size=4096).rollout_index == 4095
    assert sub(0, size=None, default_group_size=5).group_size == 5
    fixed = PromptSpec(PROMPT.messages, baseline_response="")
    assert sub(0, prompt=fixed, mode="fixed_baseline").prompt.baseline_response == ""


# ---------------------------------------------------------------- capacity / draining


def test_max_active_cohorts_is_capacity_exhausted_for_new_cohorts_only() -> None:
    reg, _ = registry(max_active=1)
    first = reg.submit(sub(0, gid="a"), T0).cohort
    assert first is not None
    full = rejected(reg.submit(sub(0, gid="b"), T0), Reason.CAPACITY_EXHAUSTED)
    assert "max_active_cohorts=1" in full.message
    rejected(reg.submit(sub(0, gid=None, task_index=1), T0), Reason.CAPACITY_EXHAUSTED)
    # Members of the cohort that holds the capacity still get in.
    assert reg.submit(sub(1, gid="a"), T0).disposition is Disposition.ACCEPTED
    assert reg.submit(sub(0, gid="a"), T0).disposition is Disposition.ATTACHED
    assert reg.fail(first, "done", T0)
    assert reg.submit(sub(0, gid="b"), T0).disposition is Disposition.ACCEPTED


def test_cohorts_counted_elsewhere_share_the_capacity_and_the_principal_quota() -> None:
    """Replicas decide about one group in a registry holding only it: the deployment's
    other active cohorts are counted in, so the limits mean the same as in one process."""
    reg, _ = registry(max_active=3)
    reg.count_elsewhere(2, {"": 1})
    assert reg.submit(sub(0, gid="a"), T0).disposition is Disposition.ACCEPTED
    full = rejected(reg.submit(sub(0, gid="b"), T0), Reason.CAPACITY_EXHAUSTED)
    assert "max_active_cohorts=3" in full.message
    # A new attempt of a group held here replaces it: still within the bound.
    renewed = reg.submit(sub(0, gid="a", attempt=1, text="again"), T0 + 1)
    assert renewed.disposition is Disposition.ACCEPTED
    quota = Settings(max_active_cohorts=100, max_active_cohorts_per_principal=2)
    scoped = CohortRegistry(quota, MemoryStore(quota))
    scoped.count_elsewhere(5, {"": 2, "other": 0})
    refused = rejected(scoped.submit(sub(0, gid="c"), T0), Reason.CAPACITY_EXHAUSTED)
    assert "max_active_cohorts_per_principal=2" in refused.message


def test_draining_refuses_new_cohorts_and_slots_but_attach_and_replay_still_work() -> None:
    reg, _ = registry()
    collecting = reg.submit(sub(0, gid="c"), T0).cohort
    evaluating = fill(reg, T0, gid="e")
    complete(reg, T0, gid="d")
    reg.start_draining()
    assert reg.draining

    rejected(reg.submit(sub(0, gid="new"), T0), Reason.SHUTTING_DOWN)
    rejected(reg.submit(sub(0, gid=None, task_index=1), T0), Reason.SHUTTING_DOWN)
    rejected(reg.submit(sub(0, gid="c", attempt=1), T0), Reason.SHUTTING_DOWN)
    rejected(reg.submit(sub(1, gid="c"), T0), Reason.SHUTTING_DOWN)
    # A refused new attempt did not supersede the running one.
    assert collecting is not None and collecting.phase is Phase.COLLECTING
    assert reg.latest_attempt("c", T0) == 0

    assert reg.submit(sub(0, gid="c"), T0).disposition is Disposition.ATTACHED
    assert reg.submit(sub(2, gid="e"), T0).cohort is evaluating
    assert reg.submit(sub(1, gid="d"), T0).disposition is Disposition.REPLAYED


# ---------------------------------------------------------------- collection deadline


def test_the_collection_deadline_fires_only_at_or_after_the_deadline() -> None:
    reg, _ = registry()
    cohort = reg.submit(sub(0), T0).cohort
    assert cohort is not None
    assert not reg.collection_deadline(cohort, T0 + COLLECTION_S - 1e-6)
    assert cohort.phase is Phase.COLLECTING
    assert reg.collection_deadline(cohort, T0 + COLLECTION_S)
    assert cohort.phase is Phase.FAILED
    assert isinstance(cohort.outcome, Failed)
    assert "1/3 members; missing rollout_index: 1, 2" in cohort.outcome.reason
    assert not reg.collection_deadline(cohort, T0 + COLLECTION_S + 1)


@pytest.mark.parametrize("phase", [Phase.EVALUATING, Phase.COMPLETED])
def test_a_late_collection_timer_is_a_no_op(phase: Phase) -> None:
    reg, _ = registry()
    cohort = fill(reg, T0)
    if phase is Phase.COMPLETED:
        assert reg.evaluation_finished(cohort, completed(3), T0 + 1)
    outcome = cohort.outcome
    assert not reg.collection_deadline(cohort, T0 + COLLECTION_S + 10)
    assert cohort.phase is phase and cohort.outcome is outcome


def test_the_last_member_arriving_at_the_deadline_gets_exactly_one_disposition() -> None:
    reg, _ = registry()
    reg.submit(sub(0), T0)
    cohort = reg.submit(sub(1), T0 + 1).cohort
    assert cohort is not None
    # The timer has not run yet when the last member arrives exactly at the deadline.
    last = reg.submit(sub(2), T0 + COLLECTION_S)
    rejection = rejected(last, Reason.COHORT_FAILED)
    assert "collection deadline expired" in rejection.message
    assert last.ended == [cohort]
    assert cohort.phase is Phase.FAILED and not last.frozen
    # The timer then runs: nothing changes.
    outcome = cohort.outcome
    assert not reg.collection_deadline(cohort, T0 + COLLECTION_S)
    assert cohort.outcome is outcome
    # And any later member of that cohort gets the same answer.
    rejected(reg.submit(sub(2), T0 + COLLECTION_S + 1), Reason.COHORT_FAILED)
    rejected(reg.submit(sub(0), T0 + COLLECTION_S + 1), Reason.COHORT_FAILED)


def test_an_identical_member_after_the_deadline_also_ends_the_cohort_once() -> None:
    reg, _ = registry()
    cohort = reg.submit(sub(0), T0).cohort
    late = reg.submit(sub(0), T0 + COLLECTION_S + 5)
    rejected(late, Reason.COHORT_FAILED)
    assert late.ended == [cohort]


def test_duplicates_and_new_slots_never_extend_the_collection_deadline() -> None:
    reg, _ = registry()
    cohort = reg.submit(sub(0), T0).cohort
    assert cohort is not None
    for t in (10.0, 50.0, 99.0):
        reg.submit(sub(0), T0 + t)
    reg.submit(sub(1), T0 + 99)
    assert cohort.collection_deadline == T0 + COLLECTION_S
    assert reg.collection_deadline(cohort, T0 + COLLECTION_S)


# ---------------------------------------------------------------- evaluation


def test_evaluation_finished_after_the_evaluation_deadline_is_discarded() -> None:
    reg, _ = registry()
    cohort = fill(reg, T0)
    assert not reg.evaluation_deadline(cohort, T0 + EVALUATION_S - 1e-6)
    assert cohort.phase is Phase.EVALUATING
    assert reg.evaluation_deadline(cohort, T0 + EVALUATION_S)
    assert cohort.phase is Phase.COMPLETED
    assert isinstance(cohort.outcome, Masked)
    assert f"cohort_evaluation_timeout_s={EVALUATION_S:g}" in cohort.outcome.reason
    masked = cohort.outcome
    assert not reg.evaluation_finished(cohort, completed(3), T0 + EVALUATION_S + 1)
    assert cohort.outcome is masked
    assert not reg.evaluation_deadline(cohort, T0 + EVALUATION_S + 1)


def test_the_evaluation_deadline_does_not_touch_a_collecting_cohort() -> None:
    reg, _ = registry()
    cohort = reg.submit(sub(0), T0).cohort
    assert cohort is not None
    assert not reg.evaluation_deadline(cohort, T0 + 10 * EVALUATION_S)
    assert not reg.evaluation_finished(cohort, completed(3), T0)
    assert cohort.phase is Phase.COLLECTING


@pytest.mark.parametrize("count", [2, 4])
def test_a_completed_outcome_with_the_wrong_number_of_rewards_fails_the_cohort(
    count: int,
) -> None:
    reg, _ = registry()
    cohort = fill(reg, T0)
    assert reg.evaluation_finished(cohort, completed(count), T0 + 1)
    assert cohort.phase is Phase.FAILED
    assert isinstance(cohort.outcome, Failed)
    assert f"{count} rewards for 3 members" in cohort.outcome.reason
    rejected(reg.submit(sub(0), T0 + 2), Reason.COHORT_FAILED)


def test_a_masked_outcome_completes_the_cohort() -> None:
    reg, _ = registry()
    cohort = fill(reg, T0)
    assert reg.judge_failed(cohort, "judge failed: 503", T0 + 1)
    assert cohort.phase is Phase.COMPLETED and cohort.outcome == Masked("judge failed: 503")
    assert not reg.evaluation_finished(cohort, completed(3), T0 + 2)


# ---------------------------------------------------------------- retention


def test_evicting_an_old_attempts_tombstone_never_removes_the_newer_attempts_fence() -> None:
    ttl = 100.0
    reg, store = registry(ttl_s=ttl, collection_s=1000.0, max_records=3)
    old = complete(reg, T0, attempt=0)
    new = reg.submit(sub(0, attempt=1), T0 + 1).cohort
    assert new is not None

    # By TTL: attempt 0's tombstone expires while attempt 1 is still collecting.
    later = T0 + ttl + 50
    assert reg.submit(sub(1, attempt=1), later).disposition is Disposition.ACCEPTED
    assert store.tombstone(old.key, later) is None
    assert reg.latest_attempt("g", later) == 1
    rejected(reg.submit(sub(0, attempt=0), later), Reason.ATTEMPT_SUPERSEDED)

    # By count: other groups push attempt 0's records out; the fence stays.
    for n in range(10):
        complete(reg, later, gid=f"other-{n}", size=1)
    rejected(reg.submit(sub(2, attempt=0), later), Reason.ATTEMPT_SUPERSEDED)

    # Once attempt 1 is terminal too, evicting attempt 0's tombstone keeps the fence.
    assert reg.submit(sub(2, attempt=1), later).frozen
    assert reg.evaluation_finished(new, completed(3), later)
    reg2, store2 = registry(ttl_s=ttl)
    complete(reg2, T0, attempt=0)
    complete(reg2, T0 + 60, attempt=1)
    t = T0 + ttl + 10  # attempt 0's tombstone expired, attempt 1's has not
    rejected(reg2.submit(sub(0, attempt=0), t), Reason.ATTEMPT_SUPERSEDED)
    assert store2.tombstone(CohortKey("g", None, 0), t) is None
    assert reg2.submit(sub(0, attempt=1), t).disposition is Disposition.REPLAYED


def test_retention_by_ttl_drops_tombstones_and_watermarks() -> None:
    ttl = 100.0
    reg, store = registry(ttl_s=ttl)
    cohort = complete(reg, T0)
    assert store.tombstone(cohort.key, T0 + ttl - 1) is not None
    assert reg.submit(sub(0), T0 + ttl - 1).disposition is Disposition.REPLAYED
    assert store.tombstone(cohort.key, T0 + ttl) is None
    # The next event sweeps the expired records away.
    reg.submit(sub(0, gid="unrelated", size=2), T0 + ttl)
    counts = store.counts()
    assert counts["tombstones"] == 0
    assert counts["watermarks"] == 1  # only the unrelated, active group's
    assert reg.latest_attempt("g", T0 + ttl) is None
    # Past retention an identical run is judged afresh.
    assert reg.submit(sub(0), T0 + ttl).disposition is Disposition.ACCEPTED


def test_retention_by_count_keeps_the_newest_terminal_cohorts() -> None:
    reg, store = registry(max_records=3)
    keys = [complete(reg, T0 + n, gid=f"g{n}", size=1).key for n in range(6)]
    reg.submit(sub(0, gid=None, task_index=1, size=2), T0 + 10)  # sweeps
    counts = store.counts()
    assert counts["tombstones"] == 3
    assert counts["watermarks"] == 3
    assert [store.tombstone(k, T0 + 10) is not None for k in keys] == [False] * 3 + [True] * 3
    assert reg.submit(sub(0, gid="g5", size=1), T0 + 10).disposition is Disposition.REPLAYED
    assert reg.submit(sub(0, gid="g0", size=1), T0 + 10).disposition is Disposition.ACCEPTED


def test_active_groups_keep_their_watermark_whatever_the_count() -> None:
    reg, _ = registry(max_records=2, ttl_s=10.0, collection_s=1000.0)
    actives = [reg.submit(sub(0, gid=f"a{n}", attempt=5), T0).cohort for n in range(5)]
    for n in range(5):
        complete(reg, T0 + 1, gid=f"done{n}", size=1)
    t = T0 + 500  # every TTL has passed, and the count is over the limit
    for n in range(5):
        reg.submit(sub(1, gid=f"a{n}", attempt=5), t)
    for n in range(5):
        rejected(reg.submit(sub(0, gid=f"a{n}", attempt=4), t), Reason.ATTEMPT_SUPERSEDED)
        assert reg.latest_attempt(f"a{n}", t) == 5
    assert all(c is not None and c.phase is Phase.COLLECTING for c in actives)


def test_tombstones_hold_no_answer_bodies() -> None:
    reg, store = registry()
    secret = "THE-ANSWER-BODY-42"
    reasoning = "THE-REASONING-BODY-43"
    member = sub(0, size=2, candidate=CandidateInput(output_text=secret, reasoning_text=reasoning))
    responses = CandidateInput(
        responses_api_json='{"output": [{"type": "message", "content": '
        '[{"type": "output_text", "text": "RESPONSES-BODY-44"}]}]}'
    )
    reg.submit(member, T0)
    cohort = reg.submit(sub(1, size=2, candidate=responses), T0).cohort
    assert cohort is not None
    assert reg.evaluation_finished(cohort, completed(2), T0)
    failed = reg.submit(sub(0, gid="f", size=2, text=secret), T0).cohort
    assert failed is not None and reg.fail(failed, "cancelled", T0)

    for key in (cohort.key, failed.key):
        tomb = store.tombstone(key, T0)
        assert tomb is not None
        values = walk(tomb)
        forbidden = (AnswerTexts, CandidateSpec, Member, Cohort)
        assert not [v for v in values if isinstance(v, forbidden)]
        text = repr(tomb)
        for body in (secret, reasoning, "RESPONSES-BODY-44"):
            assert body not in text
    # Terminal cohorts drop their bodies too.
    assert cohort.members == {} and cohort.snapshot is None
    assert failed.members == {} and failed.snapshot is None


# ---------------------------------------------------------------- cost


class CountingStore:
    """Delegates to a MemoryStore and counts every call (lookups must not scan)."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        target = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*args, **kwargs)

        return counted

    def total(self) -> int:
        return sum(self.calls.values())

    def counts(self) -> Mapping[str, int]:
        return self.inner.counts()


def _prefill(store: MemoryStore, n: int, now: float) -> None:
    digest = sub(0, size=1).prompt_digest
    outcome = completed(1)
    for k in range(n):
        key = CohortKey(f"old-{k}", None, 0)
        store.put_tombstone(Tombstone(key, 1, digest, {0: "d" * 64}, outcome, now), now)
        store.raise_watermark(key.group_scope or "", 0, now)


def _requests(reg: CohortRegistry, n: int, now: float) -> int:
    """n member submissions through a realistic mix; returns how many were made."""
    made = 0
    for k in range(n // 4):
        gid = f"new-{k}"
        cohort = reg.submit(sub(0, gid=gid, size=2), now).cohort
        assert cohort is not None
        reg.submit(sub(0, gid=gid, size=2), now)  # a duplicate
        reg.submit(sub(1, gid=gid, size=2), now)  # fills it
        assert reg.evaluation_finished(cohort, completed(2), now)
        reg.submit(sub(1, gid=gid, size=2), now)  # a replay
        made += 4
    return made


@pytest.mark.parametrize("retained", [5_000, 50_000])
def test_cost_per_request_stays_flat_with_many_retained_cohorts(retained: int) -> None:
    store = MemoryStore(Settings(max_terminal_cohorts=retained))
    counting = CountingStore(store)
    reg = CohortRegistry(registry()[0].config, counting)
    _prefill(store, retained, T0)
    assert store.counts()["tombstones"] == retained

    before_examined, before_calls = reg.evictions_examined, counting.total()
    made = _requests(reg, 1000, T0 + 1)
    examined = reg.evictions_examined - before_examined
    calls = counting.total() - before_calls
    # Every request adds at most one tombstone and one watermark, and count retention
    # pops at most that many from the old end, plus one look at each end.
    assert examined / made <= 3.0, examined / made
    assert calls / made <= 6.0, counting.calls
    assert store.counts()["tombstones"] == retained
    assert store.counts()["watermarks"] <= retained


def test_expiry_of_many_records_is_amortised_over_their_insertions() -> None:
    reg, store = registry(ttl_s=10.0, max_records=100_000)
    _prefill(store, 20_000, T0)
    before = reg.evictions_examined
    made = _requests(reg, 400, T0 + 11)  # everything prefilled has expired
    examined = reg.evictions_examined - before
    # One sweep pays for the 40,000 expired records; the rest cost O(1) each.
    assert examined <= 2 * 20_000 + 3 * made
    assert store.counts()["tombstones"] == made // 4


def test_cost_stays_flat_with_more_active_groups_than_retained_watermarks() -> None:
    """Watermarks of active groups are pinned; sweeping must not rotate all of them."""
    reg, store = registry(max_records=50, collection_s=1e9)
    for k in range(2_000):
        reg.submit(sub(0, gid=f"active-{k}", size=2), T0)
    assert store.counts()["watermarks"] >= 2_000

    before = reg.evictions_examined
    made = 0
    for k in range(1_000):
        reg.submit(sub(0, gid=f"active-{k % 2_000}", size=2), T0 + 1)  # attach
        made += 1
    examined = reg.evictions_examined - before
    assert examined / made <= 6.0, examined / made
    # The fences of every active group survive.
    for k in range(0, 2_000, 97):
        assert reg.latest_attempt(f"active-{k}", T0 + 1) == 0


def test_a_new_attempt_with_a_different_prompt_is_prompt_mismatch_and_supersedes_nothing() -> None:
    reg, _ = registry()
    old = reg.submit(sub(0, attempt=0), T0).cohort
    assert old is not None
    rejected(reg.submit(sub(0, attempt=1, prompt=OTHER_PROMPT), T0 + 1), Reason.PROMPT_MISMATCH)
    rejected(reg.submit(sub(0, attempt=1, size=5), T0 + 1), Reason.PROMPT_MISMATCH)
    assert old.phase is Phase.COLLECTING
    assert reg.latest_attempt("g", T0 + 1) == 0


def test_a_new_attempt_at_capacity_replaces_its_old_attempt_but_a_new_group_is_refused() -> None:
    reg, _ = registry(max_active=2)
    old = reg.submit(sub(0, gid="a"), T0).cohort
    reg.submit(sub(0, gid="b"), T0)
    assert old is not None
    rejected(reg.submit(sub(0, gid="c"), T0 + 1), Reason.CAPACITY_EXHAUSTED)
    renewed = reg.submit(sub(0, gid="a", attempt=1, text="again"), T0 + 1)
    assert renewed.disposition is Disposition.ACCEPTED and renewed.ended == [old]
    assert reg.active_count() == 2


# ---------------------------------------------------------------- legacy judge failure


def _mask_legacy(reg: CohortRegistry, now: float, **kw: Any) -> Cohort:
    cohort = fill(reg, now, gid=None, **kw)
    assert reg.judge_failed(cohort, "judge failed: HTTP 503", now)
    return cohort


def test_a_masked_legacy_cohort_stays_fenced_and_resends_replay_the_masked_result() -> None:
    reg, _ = registry()
    cohort = _mask_legacy(reg, T0, task_index=7)
    assert isinstance(cohort.outcome, Masked)
    assert "HTTP 503" in cohort.outcome.reason
    assert LEGACY_RETRY_ADVICE in cohort.outcome.reason  # the waiters learn it too
    again = reg.submit(sub(1, gid=None, task_index=7), T0 + 1)
    assert again.disposition is Disposition.REPLAYED and again.cohort is None
    assert again.replay is not None and again.replay.masked
    assert again.replay.outcome == cohort.outcome
    assert reg.active_count() == 0


def test_a_delayed_or_regenerated_member_of_a_masked_legacy_key_cannot_start_a_rerun() -> None:
    reg, _ = registry()
    _mask_legacy(reg, T0, prompt_id="p-9")
    for member in (
        sub(0, gid=None, prompt_id="p-9", text="a regenerated answer"),
        sub(2, gid=None, prompt_id="p-9", text="a delayed answer of the failed run"),
    ):
        decision = reg.submit(member, T0 + 5)
        assert decision.disposition is Disposition.REPLAYED, decision
        assert decision.replay is not None and decision.replay.masked
    assert reg.active_count() == 0


def test_a_masked_legacy_key_is_fenced_only_until_retention_drops_it() -> None:
    reg, _ = registry(ttl_s=60.0)
    _mask_legacy(reg, T0, task_index=3)
    later = reg.submit(sub(0, gid=None, task_index=3), T0 + 61)
    assert later.disposition is Disposition.ACCEPTED


def test_legacy_advice_survives_a_judge_reason_of_the_maximum_length() -> None:
    reg, _ = registry()
    cohort = fill(reg, T0, gid=None, task_index=1)
    assert reg.judge_failed(cohort, "é" * 5000, T0)
    assert isinstance(cohort.outcome, Masked)
    assert cohort.outcome.reason.endswith(LEGACY_RETRY_ADVICE)
    assert len(cohort.outcome.reason.encode()) <= 2000


def test_a_masked_explicit_cohort_still_replays_and_a_newer_attempt_recovers() -> None:
    reg, _ = registry()
    cohort = fill(reg, T0)
    assert reg.judge_failed(cohort, "judge failed", T0)
    assert isinstance(cohort.outcome, Masked)
    assert LEGACY_RETRY_ADVICE not in cohort.outcome.reason
    conflict = reg.submit(sub(0, text="other"), T0 + 1)
    assert conflict.disposition is Disposition.REJECTED  # slot conflict, as before
    newer = reg.submit(sub(0, attempt=1), T0 + 1)
    assert newer.disposition is Disposition.ACCEPTED


def test_tombstones_never_exceed_max_terminal_cohorts_even_without_submissions() -> None:
    """Cohorts that end by timer (no submission sweeps in between) respect the bound."""
    reg, store = registry(max_records=4)
    cohorts = [reg.submit(sub(0, gid=f"timer-{n}"), T0).cohort for n in range(10)]
    for n, cohort in enumerate(cohorts):
        assert cohort is not None
        assert reg.collection_deadline(cohort, T0 + COLLECTION_S)
        assert store.counts()["tombstones"] == min(n + 1, 4)
    # The newest are kept (insertion order is finish order).
    kept = [c for c in cohorts if c is not None and store.tombstone(c.key, T0 + COLLECTION_S)]
    assert kept == cohorts[-4:]


def test_a_dropped_registry_is_freed_at_once_not_by_the_cyclic_collector() -> None:
    """A decision's one-group registry and its store form no reference cycle (the
    store's eviction callback holds the registry weakly): dropping it frees it, and the
    retention it still does reaches its outbox."""
    import gc
    import weakref

    settings = Settings(max_terminal_cohorts=1)
    store = MemoryStore(settings)
    reg = CohortRegistry(settings, store)
    gc.disable()
    try:
        gone = weakref.ref(reg)
        del reg
        assert gone() is None
    finally:
        gc.enable()
    kept = CohortRegistry(settings, MemoryStore(settings))
    kept.store.on_evict("watermark", "scope")
    assert [type(r).__name__ for r in kept._outbox] == ["DropWatermark"]
