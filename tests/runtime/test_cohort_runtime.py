"""The asyncio runtime: waiters, timers, judge tasks and publication, deterministically.

Time is a ManualClock; every judge call is a scripted call that the test releases or
fails. Every scenario ends with a leak check: no owned task, waiter, judge permit or
cohort body is left behind.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
from typing import Any

import pytest

from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    Failed,
    Masked,
    Outcome,
    Phase,
    Reason,
    Tombstone,
)
from genrm_grpc.cohort.registry import Disposition
from genrm_grpc.judge.client import JudgeFailedError
from genrm_grpc.runtime.live import CallInterrupted, PairProgress, Ticket
from genrm_grpc.scoring import aggregate, judge_passes
from genrm_grpc.scoring.types import (
    AnswerTexts,
    GroupScores,
    JudgedPair,
    MemberScore,
    Verdict,
)
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.testing import ManualClock

from .conftest import Make
from .support import (
    COLLECTION_S,
    EVALUATION_S,
    PROMPT,
    Call,
    Runtime,
    ScriptedJudge,
    advance,
    assert_no_leaks,
    lookup,
    phase_of,
    settle,
    sub,
    text,
    until,
)

# ---------------------------------------------------------------- helpers


def accepted(ticket: Ticket) -> Ticket:
    assert ticket.disposition in (Disposition.ACCEPTED, Disposition.ATTACHED), ticket
    assert ticket.waiter is not None
    return ticket


def rejected(ticket: Ticket, reason: Reason) -> str:
    assert ticket.disposition is Disposition.REJECTED, ticket
    assert ticket.rejection is not None and ticket.rejection.reason is reason, ticket.rejection
    return ticket.rejection.message


def outcome_now(ticket: Ticket) -> Outcome:
    """The outcome a waiter already holds (fails if it is not published yet)."""
    assert ticket.waiter is not None
    assert ticket.waiter.future.done(), "not published"
    return ticket.waiter.future.result()


def done(ticket: Ticket) -> bool:
    assert ticket.waiter is not None
    return ticket.waiter.future.done()


async def cohort_of(runtime: Runtime, **kw: Any) -> Cohort:
    """The active cohort of ``sub(0, **kw)``: a copy read from the store (read its phase
    again with ``phase_of``)."""
    cohort = await lookup(runtime, sub(0, **kw).key)
    assert isinstance(cohort, Cohort), cohort
    return cohort


async def fill(runtime: Runtime, size: int = 3, **kw: Any) -> list[Ticket]:
    return [accepted(await runtime.submit(sub(i, size=size, **kw))) for i in range(size)]


async def assert_ended(runtime: Runtime, cohort: Cohort, outcome: Outcome, phase: Phase) -> None:
    """``cohort`` (a copy read from the store) ended with ``outcome``: its tombstone's,
    compared by value."""
    assert await phase_of(runtime, cohort.key) is phase
    found = await lookup(runtime, cohort.key)
    assert isinstance(found, Tombstone) and found.outcome == outcome, found


def deadline_timers(runtime: Runtime) -> int:
    """Deadline timers still armed in the in-process store (its sweeps' are not)."""
    assert isinstance(runtime.shared, LocalGroups)
    return runtime.shared.state.deadline_timers()


def active_count(runtime: Runtime) -> int:
    assert isinstance(runtime.shared, LocalGroups)
    return runtime.shared.state.active_total


def index_of(answer: str) -> int:
    return int(answer.split(":")[0].rsplit("/", 1)[1])


def judged_from(calls: list[Call]) -> list[JudgedPair]:
    """The pairs the calls judged, assuming they were started in plan order."""
    out = []
    for call in calls:
        assert call.verdict is not None
        i, j = index_of(call.inp.response_1), index_of(call.inp.response_2)
        out.append((i, j, call.verdict))
    return [JudgedPair(i, j, 0, v) for i, j, v in out]


# ---------------------------------------------------------------- publication


async def test_a_full_group_is_judged_once_per_pair_and_judge_and_published_together(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, num_judges_per_comparison=2)
    progress: list[PairProgress] = []
    tickets = [accepted(await rt.submit(sub(i), on_progress=progress.append)) for i in range(2)]
    await settle()
    assert judge.calls == []  # after_collection: nothing is judged before the group is full
    tickets.append(accepted(await rt.submit(sub(2))))
    cohort = await cohort_of(rt)
    assert cohort.phase is Phase.EVALUATING

    plan = judge_passes(3, "circular", 2)
    await until(lambda: len(judge.calls) == len(plan))
    await settle()
    assert len(judge.calls) == len(plan) == 6
    assert [(index_of(c.inp.response_1), index_of(c.inp.response_2)) for c in judge.calls] == [
        (i, j) for i, j, _ in plan
    ]
    assert all(c.inp.messages == PROMPT.messages for c in judge.calls)
    assert all(c.inp.principle == "Be accurate." for c in judge.calls)

    verdicts = [Verdict(5, 1, 1), Verdict(2, 4, 5), Verdict(3, 3, 2), Verdict(1, 5, 6)]
    verdicts += [Verdict(4, 4, 4), Verdict(3, 2, 3)]
    for call, verdict in zip(judge.calls[:-1], verdicts, strict=False):
        call.release(verdict)
    await settle()
    # Five of six comparisons are done: nobody has a result yet.
    assert not any(done(t) for t in tickets)
    assert cohort.phase is Phase.EVALUATING
    assert len(progress) == 5  # progress is reported per pair, per distinct callback

    judge.calls[-1].release(verdicts[-1])
    await until(lambda: any(done(t) for t in tickets))
    # Publication is one step: every waiter has it the moment any waiter has it.
    outcomes = [outcome_now(t) for t in tickets]
    assert all(o is outcomes[0] for o in outcomes)
    outcome = outcomes[0]
    assert isinstance(outcome, Completed)

    texts = [AnswerTexts("hmm", text("g", i)) for i in range(3)]
    judged = [JudgedPair(i, j, k, v) for (i, j, k), v in zip(plan, verdicts, strict=True)]
    expected = aggregate(texts, judged, rt.config)
    assert [r.reward for r in outcome.rewards] == [m.reward for m in expected.members]
    for k, reward in enumerate(outcome.rewards):
        assert reward.comparisons == tuple(p for p in judged if k in (p.response_i, p.response_j))
    assert outcome.metrics["mean_individual_score"] == expected.metrics["mean_individual_score"]
    assert outcome.metrics["judge_output_tokens_total"] == 60.0
    assert rt.judge_calls == 6
    assert await phase_of(rt, cohort.key) is Phase.COMPLETED
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_concurrent_identical_submissions_attach_to_one_outcome(
    make: Make,
    clock: ManualClock,
) -> None:
    judge = ScriptedJudge()
    rt = await make(judge, clock)
    members = [0, 0, 0, 1, 1, 2]
    tickets = list(await asyncio.gather(*(rt.submit(sub(i)) for i in members)))
    assert [t.disposition for t in tickets] == [
        Disposition.ACCEPTED,
        Disposition.ATTACHED,
        Disposition.ATTACHED,
        Disposition.ACCEPTED,
        Disposition.ATTACHED,
        Disposition.ACCEPTED,
    ]
    # Identical members arriving while it is evaluating attach too, at no cost.
    tickets += [accepted(await rt.submit(sub(i))) for i in range(3)]
    assert tickets[-1].disposition is Disposition.ATTACHED
    cohort = await cohort_of(rt)
    await until(lambda: len(judge.calls) == 3)
    judge.release_all()
    outcomes = await asyncio.gather(*(t.waiter.wait() for t in tickets if t.waiter))
    assert all(o is outcomes[0] for o in outcomes)
    assert isinstance(outcomes[0], Completed)
    assert len(judge.calls) == rt.judge_calls == 3
    # After completion an identical member replays, still without a judge call.
    replay = await rt.submit(sub(1))
    assert replay.disposition is Disposition.REPLAYED
    assert replay.replay is not None and replay.replay.outcome == outcomes[0]
    assert len(judge.calls) == 3
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_a_different_response_racing_an_identical_one_for_a_slot(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    go = asyncio.Event()

    async def submit_when_told(answer: str | None) -> Ticket:
        await go.wait()
        return await rt.submit(sub(0, answer=answer))

    racers = [
        asyncio.create_task(submit_when_told(None)),
        asyncio.create_task(submit_when_told("Saturn, definitely.")),
        asyncio.create_task(submit_when_told(None)),
        asyncio.create_task(submit_when_told("Saturn, definitely.")),
    ]
    await settle()
    go.set()
    tickets = await asyncio.gather(*racers)
    dispositions = [t.disposition for t in tickets]
    assert dispositions.count(Disposition.ACCEPTED) == 1
    winner = next(t for t in tickets if t.disposition is Disposition.ACCEPTED)
    cohort = await cohort_of(rt)
    winning_digest = cohort.members[0].candidate.digest
    for ticket, answer in zip(tickets, [None, "Saturn, definitely."] * 2, strict=True):
        same = sub(0, answer=answer).candidate.digest == winning_digest
        if ticket is winner:
            continue
        if same:
            assert ticket.disposition is Disposition.ATTACHED
        else:
            rejected(ticket, Reason.SLOT_CONFLICT)
    assert rt.stats()["waiters"] == 2
    assert await rt.cancel_cohort(cohort.key, "test over")
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


# ---------------------------------------------------------------- supersession, cancel


async def test_supersession_during_evaluation_fails_the_old_attempt_and_fences_its_judge(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    old_tickets = await fill(rt, attempt=0)
    old = await cohort_of(rt, attempt=0)
    await until(lambda: len(judge.calls) == 3)
    judge.calls[0].stubborn = True  # this old call will answer late, despite the cancel
    judge.calls[1].release(Verdict(5, 1, 1))  # and this one finished before supersession
    await settle()

    progress: list[PairProgress] = []
    new_first = accepted(await rt.submit(sub(0, attempt=1), on_progress=progress.append))
    assert new_first.disposition is Disposition.ACCEPTED
    # The old attempt's waiters learn at once that it failed.
    for ticket in old_tickets:
        outcome = outcome_now(ticket)
        assert isinstance(outcome, Failed)
        assert "superseded by attempt 1" in outcome.reason
    assert await phase_of(rt, old.key) is Phase.FAILED
    await until(lambda: judge.calls[2].state == "cancelled")
    assert judge.calls[0].cancels_ignored >= 1

    # The stubborn old call now answers: nothing reaches the new attempt.
    judge.calls[0].release(Verdict(1, 5, 6))
    await settle()
    assert not done(new_first)
    assert progress == []
    assert len(judge.calls) == 3

    new_tickets = [new_first] + [accepted(await rt.submit(sub(i, attempt=1))) for i in (1, 2)]
    new = await cohort_of(rt, attempt=1)
    await until(lambda: len(judge.calls) == 6)
    new_verdicts = [Verdict(2, 3, 4), Verdict(3, 3, 3), Verdict(4, 1, 2)]
    for call, verdict in zip(judge.calls[3:], new_verdicts, strict=True):
        assert "/1/" in call.inp.response_1  # judged answers are the new attempt's
        call.release(verdict)
    outcome = await new_first.waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    assert all(outcome_now(t) is outcome for t in new_tickets)
    seen = {p.verdict for r in outcome.rewards for p in r.comparisons}
    assert seen == set(new_verdicts)
    assert {p.key for p in progress} == {new.key} and len(progress) == 3
    rejected(await rt.submit(sub(0, attempt=0)), Reason.ATTEMPT_SUPERSEDED)
    assert rt.judge_calls == 6
    await assert_no_leaks(rt, judge=judge, cohorts=[old, new])


async def test_cancel_cohort_during_evaluation_fails_waiters_and_cancels_judging(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    tickets = await fill(rt)
    tickets.append(accepted(await rt.submit(sub(1))))
    cohort = await cohort_of(rt)
    await until(lambda: len(judge.calls) == 3)
    judge.calls[0].release()
    await settle()

    assert await rt.cancel_cohort(cohort.key, "cancelled by the operator")
    for ticket in tickets:
        outcome = outcome_now(ticket)
        assert isinstance(outcome, Failed) and outcome.reason == "cancelled by the operator"
    assert not await rt.cancel_cohort(cohort.key, "again")
    await rt.drain_tasks()
    assert [c.state for c in judge.calls] == ["done", "cancelled", "cancelled"]
    message = rejected(await rt.submit(sub(2)), Reason.COHORT_FAILED)
    assert "cancelled by the operator" in message
    assert len(judge.calls) == 3
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_cancel_cohort_of_an_unknown_key_is_false(make: Make, clock: ManualClock) -> None:
    rt = await make(ScriptedJudge(), clock)
    assert not await rt.cancel_cohort(CohortKey("nope", None, 0), "x")
    await assert_no_leaks(rt)


# ---------------------------------------------------------------- deadlines


async def test_the_collection_deadline_racing_the_last_member_gives_one_disposition(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    first = [accepted(await rt.submit(sub(i))) for i in (0, 1)]
    cohort = await cohort_of(rt)
    deadline = clock.now() + COLLECTION_S
    clock.set(deadline)  # the deadline is due, but its timer has not run
    last = await rt.submit(sub(2))
    message = rejected(last, Reason.COHORT_FAILED)
    assert "collection deadline expired" in message
    outcomes = [outcome_now(t) for t in first]
    assert isinstance(outcomes[0], Failed) and outcomes[1] is outcomes[0]
    assert "2/3 members; missing rollout_index: 2" in outcomes[0].reason
    clock.fire_due()  # the timer now runs late: a no-op
    assert deadline_timers(rt) == 0
    await assert_ended(rt, cohort, outcomes[0], Phase.FAILED)
    await settle()
    assert judge.calls == []
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_the_collection_deadline_fails_a_waiting_cohort_and_later_members(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    ticket = accepted(await rt.submit(sub(0)))
    cohort = await cohort_of(rt)
    await advance(clock, COLLECTION_S - 1)
    assert not done(ticket)
    await advance(clock, 1)
    outcome = outcome_now(ticket)
    assert isinstance(outcome, Failed) and "collection deadline" in outcome.reason
    rejected(await rt.submit(sub(1)), Reason.COHORT_FAILED)
    rejected(await rt.submit(sub(0)), Reason.COHORT_FAILED)
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_a_late_collection_timer_never_changes_a_completed_cohort(
    make: Make,
    clock: ManualClock,
) -> None:
    judge = ScriptedJudge(auto=True)
    rt = await make(judge, clock)
    tickets = await fill(rt)
    cohort = await cohort_of(rt)
    outcome = await tickets[0].waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    await advance(clock, COLLECTION_S + EVALUATION_S + 1)
    await assert_ended(rt, cohort, outcome, Phase.COMPLETED)
    assert (await rt.submit(sub(0))).disposition is Disposition.REPLAYED
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_the_evaluation_deadline_masks_the_cohort_and_discards_late_results(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    tickets = await fill(rt)
    cohort = await cohort_of(rt)
    await until(lambda: len(judge.calls) == 3)
    judge.calls[0].release()
    judge.calls[1].stubborn = True
    await settle()
    await advance(clock, EVALUATION_S - 1)
    assert not any(done(t) for t in tickets)
    await advance(clock, 1)
    outcome = outcome_now(tickets[0])
    assert isinstance(outcome, Masked)
    assert f"cohort_evaluation_timeout_s={EVALUATION_S:g}" in outcome.reason
    assert all(outcome_now(t) is outcome for t in tickets)
    await until(lambda: judge.calls[2].state == "cancelled")
    # A judge result landing after the deadline is discarded.
    judge.calls[1].release(Verdict(5, 1, 1))
    await rt.drain_tasks()
    assert judge.calls[1].state == "done"
    await assert_ended(rt, cohort, outcome, Phase.COMPLETED)
    replay = await rt.submit(sub(2))
    assert replay.disposition is Disposition.REPLAYED
    assert replay.replay is not None and replay.replay.outcome == outcome
    assert len(judge.calls) == 3
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


# ---------------------------------------------------------------- judge failure


async def test_a_judge_failure_masks_everyone_and_cancels_the_other_comparisons(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, concurrency=2)
    tickets = await fill(rt, size=4)  # circular: 4 comparisons, 2 at a time
    cohort = await cohort_of(rt, size=4)
    await until(lambda: len(judge.calls) == 2)
    await settle()
    assert len(judge.calls) == 2 and rt.stats()["judge_in_flight"] == 2
    judge.calls[0].fail("judge failed: 4 attempts ended with HTTP 503")
    await until(lambda: done(tickets[0]))
    outcome = outcome_now(tickets[0])
    assert isinstance(outcome, Masked)
    assert outcome.reason == "judge failed: 4 attempts ended with HTTP 503"
    assert all(outcome_now(t) is outcome for t in tickets)
    await rt.drain_tasks()
    assert [c.state for c in judge.calls] == ["failed", "cancelled"]
    assert len(judge.calls) == rt.judge_calls == 2  # the queued comparisons never ran
    assert (await rt.submit(sub(3, size=4))).disposition is Disposition.REPLAYED
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_a_judge_failure_with_every_comparison_in_flight_cancels_them_all(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, comparison_strategy="all_pairs")
    tickets = await fill(rt, size=4)
    cohort = await cohort_of(rt, size=4)
    await until(lambda: len(judge.calls) == 6)
    judge.calls[0].release()
    judge.calls[3].fail("judge failed: no answer")
    await until(lambda: done(tickets[0]))
    assert isinstance(outcome_now(tickets[0]), Masked)
    await rt.drain_tasks()
    assert [c.state for c in judge.calls] == ["done"] + ["cancelled"] * 2 + ["failed"] + [
        "cancelled"
    ] * 2
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_an_unexpected_judge_error_fails_the_cohort(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    tickets = await fill(rt)
    cohort = await cohort_of(rt)
    await until(lambda: len(judge.calls) == 3)
    judge.calls[1].raise_(RuntimeError("bug in the judge client"))
    await until(lambda: done(tickets[0]))
    outcome = outcome_now(tickets[0])
    assert isinstance(outcome, Failed) and "bug in the judge client" in outcome.reason
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


@pytest.mark.parametrize("how", ["infinite verdict", "nan reward", "too few rewards"])
async def test_rewards_that_are_not_finite_or_not_one_per_member_fail_the_cohort(
    make: Make, how: str, clock: ManualClock, judge: ScriptedJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how != "infinite verdict":
        real = aggregate

        def broken(*args: Any, **kwargs: Any) -> GroupScores:
            scores = real(*args, **kwargs)
            members = list(scores.members)
            if how == "nan reward":
                members[1] = MemberScore(math.nan, 1.0, 1.0, 0.0)
            else:
                members = members[:-1]
            return GroupScores(tuple(members), scores.metrics)

        monkeypatch.setattr("genrm_grpc.runtime.scored.aggregate", broken)
    rt = await make(judge, clock)
    tickets = await fill(rt)
    cohort = await cohort_of(rt)
    await until(lambda: len(judge.calls) == 3)
    verdict = Verdict(math.inf, 1.0, 3.0) if how == "infinite verdict" else None
    judge.release_all(verdict)
    await until(lambda: done(tickets[0]))
    outcome = outcome_now(tickets[0])
    assert isinstance(outcome, Failed), outcome
    assert "aggregation produced" in outcome.reason and "nothing was published" in outcome.reason
    assert all(outcome_now(t) is outcome for t in tickets)
    message = rejected(await rt.submit(sub(0)), Reason.COHORT_FAILED)
    assert "aggregation produced" in message
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


# ---------------------------------------------------------------- isolation, waiters


async def test_cohorts_never_wake_each_other(make: Make, clock: ManualClock) -> None:
    judge = ScriptedJudge(auto=True)
    rt = await make(judge, clock)
    waiting = accepted(await rt.submit(sub(0, gid="b", size=2)))
    other_prompt = accepted(await rt.submit(sub(0, gid=None, task_index=1, size=2)))
    finished = await fill(rt, size=2, gid="a")
    outcome = await finished[0].waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    await settle()
    assert not done(waiting) and not done(other_prompt)
    stats = rt.stats()
    assert stats["live_cohorts"] == 2 and stats["waiters"] == 2
    b = await cohort_of(rt, gid="b", size=2)
    assert b.phase is Phase.COLLECTING

    # The waiting cohorts finish on their own terms.
    accepted(await rt.submit(sub(1, gid="b", size=2)))
    assert isinstance(await waiting.waiter.wait(), Completed)  # type: ignore[union-attr]
    await advance(clock, COLLECTION_S)
    assert isinstance(outcome_now(other_prompt), Failed)
    await assert_no_leaks(rt, judge=judge, cohorts=[b])


async def test_a_cancelled_waiter_removes_only_itself_and_an_identical_retry_reattaches(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    first = accepted(await rt.submit(sub(0, size=2)))
    stays = accepted(await rt.submit(sub(0, size=2)))
    cohort = await cohort_of(rt, size=2)
    task = asyncio.create_task(first.waiter.wait())  # type: ignore[union-attr]
    await settle()
    assert rt.stats()["waiters"] == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.stats()["waiters"] == 1
    assert sorted(cohort.members) == [0] and cohort.phase is Phase.COLLECTING

    retry = await rt.submit(sub(0, size=2))
    assert retry.disposition is Disposition.ATTACHED
    last = accepted(await rt.submit(sub(1, size=2)))
    await until(lambda: len(judge.calls) == 2)
    judge.release_all()
    outcome = await retry.waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    assert outcome_now(stays) is outcome and outcome_now(last) is outcome
    assert first.waiter is not None and first.waiter.future.cancelled()
    assert len(judge.calls) == 2
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_cancelling_every_waiter_keeps_the_cohort_and_its_judging(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    tickets = await fill(rt)
    cohort = await cohort_of(rt)
    await until(lambda: len(judge.calls) == 3)
    tasks = [asyncio.create_task(t.waiter.wait()) for t in tickets if t.waiter]
    await settle()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert rt.stats()["waiters"] == 0 and cohort.phase is Phase.EVALUATING
    assert all(c.state == "blocked" for c in judge.calls)
    again = accepted(await rt.submit(sub(2)))
    judge.release_all()
    assert isinstance(await again.waiter.wait(), Completed)  # type: ignore[union-attr]
    assert len(judge.calls) == 3
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


# ---------------------------------------------------------------- shutdown


async def test_shutdown_with_the_grace_expired_fails_everything_and_drains_tasks(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    evaluating = await fill(rt, gid="e")
    collecting = accepted(await rt.submit(sub(0, gid="c")))
    cohorts = [await cohort_of(rt, gid="e"), await cohort_of(rt, gid="c")]
    await until(lambda: len(judge.calls) == 3)
    judge.calls[0].release()
    await settle()

    await asyncio.wait_for(rt.shutdown(grace_s=0), timeout=10)
    for ticket in [*evaluating, collecting]:
        outcome = outcome_now(ticket)
        assert isinstance(outcome, Failed) and outcome.reason == "server is shutting down"
    assert [c.state for c in judge.calls] == ["done", "cancelled", "cancelled"]
    # By design a stopped replica decides nothing (no decision of it could be
    # waited for): every later member is interrupted, saying nothing resumes.
    for late in (sub(0, gid="new"), sub(0, gid="e")):
        with pytest.raises(CallInterrupted, match="keeps nothing") as stopped:
            await rt.submit(late)
        assert stopped.value.reason is Reason.SHUTTING_DOWN
    await assert_no_leaks(rt, judge=judge, cohorts=cohorts)


async def test_evaluations_that_finish_within_the_shutdown_grace_publish_normally(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    evaluating = await fill(rt, gid="e")
    collecting = accepted(await rt.submit(sub(0, gid="c")))
    cohorts = [await cohort_of(rt, gid="e"), await cohort_of(rt, gid="c")]
    await until(lambda: len(judge.calls) == 3)

    shutdown = asyncio.create_task(rt.shutdown(grace_s=600))
    await until(lambda: rt.draining)
    await settle()
    assert not shutdown.done()
    # While draining: no new cohort, no new slot, but identical members attach.
    rejected(await rt.submit(sub(0, gid="new")), Reason.SHUTTING_DOWN)
    rejected(await rt.submit(sub(1, gid="c")), Reason.SHUTTING_DOWN)
    late_attach = accepted(await rt.submit(sub(1, gid="e")))
    assert late_attach.disposition is Disposition.ATTACHED

    judge.release_all()
    await asyncio.wait_for(shutdown, timeout=10)
    outcome = outcome_now(evaluating[0])
    assert isinstance(outcome, Completed)
    assert all(outcome_now(t) is outcome for t in [*evaluating, late_attach])
    failed = outcome_now(collecting)
    assert isinstance(failed, Failed) and failed.reason == "server is shutting down"
    await assert_no_leaks(rt, judge=judge, cohorts=cohorts)


async def test_shutdown_cancels_an_in_flight_compare_instead_of_waiting_for_it(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    candidates = [sub(i).candidate for i in range(3)]
    compare = asyncio.create_task(rt.compare(PROMPT, candidates))
    await until(lambda: len(judge.calls) == 3)
    await asyncio.wait_for(rt.shutdown(grace_s=0), timeout=10)
    with pytest.raises(JudgeFailedError, match="shutting down"):
        await compare
    assert all(c.state == "cancelled" for c in judge.calls)
    await assert_no_leaks(rt, judge=judge)


async def test_a_compare_that_finishes_within_the_shutdown_grace_returns(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    compare = asyncio.create_task(rt.compare(PROMPT, [sub(i).candidate for i in range(2)]))
    await until(lambda: len(judge.calls) == 2)
    shutdown = asyncio.create_task(rt.shutdown(grace_s=600))
    await settle()
    assert not shutdown.done()
    judge.release_all()
    result = await compare
    assert len(result.rewards) == 2
    await asyncio.wait_for(shutdown, timeout=10)
    await assert_no_leaks(rt, judge=judge)


# ---------------------------------------------------------------- scheduling


async def test_with_concurrency_one_the_first_ready_cohort_is_judged_first(
    make: Make,
    clock: ManualClock,
) -> None:
    judge = ScriptedJudge(auto=True)
    rt = await make(judge, clock, concurrency=1)
    order = [("b", 0), ("a", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    tickets = [accepted(await rt.submit(sub(i, gid=gid))) for gid, i in order]
    cohorts = [await cohort_of(rt, gid="a"), await cohort_of(rt, gid="b")]
    await asyncio.gather(*(t.waiter.wait() for t in tickets if t.waiter))
    groups = [c.inp.response_1.split("/")[0] for c in judge.calls]
    assert groups == ["a"] * 3 + ["b"] * 3
    assert judge.max_in_flight == 1
    await assert_no_leaks(rt, judge=judge, cohorts=cohorts)


async def test_with_concurrency_one_a_later_cohort_waits_for_the_permit(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, concurrency=1)
    a = await fill(rt, gid="a")
    b = await fill(rt, gid="b")
    for n in range(6):
        await until(lambda n=n: len(judge.calls) == n + 1)  # type: ignore[misc]
        await settle()
        assert len(judge.calls) == n + 1 and judge.in_flight == 1
        expected = "a" if n < 3 else "b"
        assert judge.calls[n].inp.response_1.startswith(expected)
        judge.calls[n].release()
    await asyncio.gather(*(t.waiter.wait() for t in [*a, *b] if t.waiter))
    await assert_no_leaks(rt, judge=judge)


async def test_eager_schedule_judges_pairs_early_but_publishes_only_when_full(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, schedule="eager")
    t0 = accepted(await rt.submit(sub(0)))
    await settle()
    assert judge.calls == []
    t1 = accepted(await rt.submit(sub(1)))
    await until(lambda: len(judge.calls) == 1)
    assert judge.calls[0].pair == (text("g", 0), text("g", 1))
    judge.calls[0].release(Verdict(5, 1, 1))
    await settle()
    cohort = await cohort_of(rt)
    assert cohort.phase is Phase.COLLECTING and not done(t0) and not done(t1)
    accepted(await rt.submit(sub(1)))  # a duplicate starts nothing
    await settle()
    assert len(judge.calls) == 1

    t2 = accepted(await rt.submit(sub(2)))
    await until(lambda: len(judge.calls) == 3)
    assert {c.pair for c in judge.calls[1:]} == {
        (text("g", 1), text("g", 2)),
        (text("g", 2), text("g", 0)),
    }
    judge.calls[1].release(Verdict(2, 3, 4))
    await settle()
    assert not done(t2)
    judge.calls[2].release(Verdict(3, 3, 3))
    outcome = await t2.waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    assert outcome_now(t0) is outcome and outcome_now(t1) is outcome
    verdicts = {p.verdict for r in outcome.rewards for p in r.comparisons}
    assert verdicts == {Verdict(5, 1, 1), Verdict(2, 3, 4), Verdict(3, 3, 3)}
    assert len(judge.calls) == rt.judge_calls == 3
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_eager_verdicts_are_discarded_when_the_collection_deadline_fails_the_cohort(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, schedule="eager")
    early = [accepted(await rt.submit(sub(i, size=4))) for i in range(3)]
    old = await cohort_of(rt, size=4)
    await until(lambda: len(judge.calls) == 2)  # (0,1) and (1,2)
    judge.calls[0].release(Verdict(5, 1, 1))
    await settle()
    await advance(clock, COLLECTION_S)
    assert all(isinstance(outcome_now(t), Failed) for t in early)
    await until(lambda: judge.calls[1].state == "cancelled")

    # A new attempt judges everything afresh: no early verdict is reused.
    fresh = await fill(rt, size=4, attempt=1)
    new = await cohort_of(rt, size=4, attempt=1)
    await until(lambda: len(judge.calls) == 2 + 4)
    judge.release_all(Verdict(3, 2, 3))
    outcome = await fresh[0].waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    assert {p.verdict for r in outcome.rewards for p in r.comparisons} == {Verdict(3, 2, 3)}
    await assert_no_leaks(rt, judge=judge, cohorts=[old, new])


async def test_an_eager_judge_failure_masks_the_cohort_once_it_is_full(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, schedule="eager")
    first = [accepted(await rt.submit(sub(i))) for i in range(2)]
    await until(lambda: len(judge.calls) == 1)
    judge.calls[0].fail("judge failed early")
    await settle()
    assert not done(first[0])  # publication still waits for the full group
    last = accepted(await rt.submit(sub(2)))
    await until(lambda: done(last))
    outcome = outcome_now(last)
    assert isinstance(outcome, Masked) and outcome.reason == "judge failed early"
    assert all(outcome_now(t) is outcome for t in first)
    await assert_no_leaks(rt, judge=judge)


async def test_an_eager_failure_in_a_cohort_that_never_fills_is_not_logged_as_unretrieved(
    make: Make, clock: ManualClock, judge: ScriptedJudge, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await make(judge, clock, schedule="eager")
    tickets = [accepted(await rt.submit(sub(i))) for i in range(2)]
    await until(lambda: len(judge.calls) == 1)
    judge.calls[0].fail("judge failed early")
    await settle()
    await advance(clock, COLLECTION_S)
    assert isinstance(outcome_now(tickets[0]), Failed)
    await assert_no_leaks(rt, judge=judge)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await settle()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_a_group_of_one_gets_the_default_score_without_a_judge_call(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, default_score=2.5)
    ticket = accepted(await rt.submit(sub(0, size=1)))
    outcome = await ticket.waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed)
    assert [r.reward for r in outcome.rewards] == [2.5]
    assert outcome.rewards[0].comparisons == ()
    assert judge.calls == [] and rt.judge_calls == 0
    assert (await rt.submit(sub(0, size=1))).disposition is Disposition.REPLAYED
    await assert_no_leaks(rt, judge=judge)


async def test_a_group_of_one_is_scored_within_its_submission_with_no_task_or_timer(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    """Nothing to judge: the outcome is there when ``submit`` returns (hot path).

    The decision itself is a task (read, decide, commit), which has ended by the next
    loop turn; it starts no other.
    """
    rt = await make(judge, clock)
    ticket = accepted(await rt.submit(sub(0, size=1)))
    assert ticket.waiter is not None and ticket.waiter.future.done()
    assert isinstance(ticket.waiter.future.result(), Completed)
    await asyncio.sleep(0)
    assert rt.stats()["owned_tasks"] == 0 and rt.stats()["live_cohorts"] == 0
    assert deadline_timers(rt) == 0  # no collection or evaluation timer left
    ticket.waiter.release()
    await assert_no_leaks(rt, judge=judge)


async def test_judge_calls_stay_exact_under_a_storm_of_duplicates_and_reconnects(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(
        judge, clock, comparison_strategy="all_pairs", num_judges_per_comparison=2, concurrency=5
    )
    survivors: list[Ticket] = []
    cancelled: list[asyncio.Task[Outcome]] = []
    for round_ in range(6):
        for i in range(4):
            for copy in range(3):
                ticket = accepted(await rt.submit(sub(i, size=4)))
                task = asyncio.create_task(ticket.waiter.wait())  # type: ignore[union-attr]
                if (round_ + i + copy) % 2:
                    cancelled.append(task)  # the client goes away, then reconnects
                else:
                    survivors.append(ticket)
        await settle(5)
        for task in cancelled:
            task.cancel()
        if round_ == 2:
            for call in judge.blocked()[:3]:
                call.release()
    cohort = await cohort_of(rt, size=4)
    await asyncio.gather(*cancelled, return_exceptions=True)
    while judge.blocked() or len(judge.calls) < 12:
        judge.release_all()
        await settle(5)
    outcomes = {id(await t.waiter.wait()) for t in survivors}  # type: ignore[union-attr]
    assert len(outcomes) == 1
    assert len(judge.calls) == rt.judge_calls == 12  # 6 pairs × 2 judges, exactly
    assert judge.max_in_flight <= 5
    assert (await rt.submit(sub(2, size=4))).disposition is Disposition.REPLAYED
    await assert_no_leaks(rt, judge=judge, cohorts=[cohort])


async def test_progress_is_reported_per_pair_while_the_cohort_is_active(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, num_judges_per_comparison=2)
    seen: list[PairProgress] = []
    await rt.submit(sub(0, size=2), on_progress=seen.append)
    await rt.submit(sub(0, size=2), on_progress=seen.append)  # the same callback counts once
    last = accepted(await rt.submit(sub(1, size=2)))
    key = (await cohort_of(rt, size=2)).key
    await until(lambda: len(judge.calls) == 4)
    judge.release_all()
    await last.waiter.wait()  # type: ignore[union-attr]
    assert sorted((p.response_i, p.response_j, p.judge_index) for p in seen) == sorted(
        judge_passes(2, "circular", 2)
    )
    assert {p.key for p in seen} == {key}
    await assert_no_leaks(rt, judge=judge)


# ---------------------------------------------------------------- compare, baseline


async def test_compare_judges_a_batch_without_a_cohort(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock)
    candidates: list[CandidateSpec] = [sub(i).candidate for i in range(3)]
    task = asyncio.create_task(rt.compare(PROMPT, candidates))
    await until(lambda: len(judge.calls) == 3)
    judge.release_all(Verdict(4, 2, 2))
    result = await task
    assert len(result.rewards) == 3
    assert active_count(rt) == 0
    failing = asyncio.create_task(rt.compare(PROMPT, candidates))
    await until(lambda: len(judge.calls) == 6)
    judge.calls[4].fail("judge failed: nope")
    with pytest.raises(JudgeFailedError, match="nope"):
        await failing
    assert [c.state for c in judge.calls[3:]] == ["cancelled", "failed", "cancelled"]
    await assert_no_leaks(rt, judge=judge)


async def test_fixed_baseline_judges_every_member_against_the_baseline(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    from genrm_grpc.cohort.model import PromptSpec

    prompt = PromptSpec(PROMPT.messages, baseline_response="The baseline: Jupiter.")
    rt = await make(judge, clock, mode="fixed_baseline", num_judges_per_comparison=2)
    tickets = [
        accepted(await rt.submit(sub(i, size=3, prompt=prompt, mode="fixed_baseline")))
        for i in range(3)
    ]
    await until(lambda: len(judge.calls) == 6)
    for call in judge.calls:
        assert call.inp.response_2 == "The baseline: Jupiter."
    # The member alternates sides between calls so position bias cancels.
    swaps = [(index_of(c.inp.response_1), c.swap) for c in judge.calls]
    assert sorted(swaps) == sorted([(m, (m + k) % 2 == 1) for k in range(2) for m in range(3)])
    judge.release_all(Verdict(4, 2, 2))
    outcome = await tickets[0].waiter.wait()  # type: ignore[union-attr]
    assert isinstance(outcome, Completed), outcome
    # Every verdict (in the member's order) gives the member 4 against the baseline's 2;
    # the baseline (index 3 = group_size) is scored but gets no reward.
    assert [r.reward for r in outcome.rewards] == [4.0, 4.0, 4.0]
    assert [(p.response_i, p.response_j, p.judge_index) for p in outcome.judged] == [
        (m, 3, k) for k in range(2) for m in range(3)
    ]
    await assert_no_leaks(rt, judge=judge)


async def test_an_eager_judge_failure_cancels_the_other_early_comparisons(
    make: Make, clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await make(judge, clock, schedule="eager")
    tickets = [accepted(await rt.submit(sub(i, size=4))) for i in range(3)]  # pairs (0,1), (1,2)
    await until(lambda: len(judge.calls) == 2)
    judge.calls[0].fail("judge failed early")
    await until(lambda: judge.calls[1].state == "cancelled")
    last = accepted(await rt.submit(sub(3, size=4)))
    await until(lambda: done(last))
    outcome = outcome_now(last)
    assert isinstance(outcome, Masked) and outcome.reason == "judge failed early"
    assert all(outcome_now(t) is outcome for t in tickets)
    assert len(judge.calls) == 2  # the pairs (2,3) and (3,0) were never sent
    await assert_no_leaks(rt, judge=judge)


# ---------------------------------------------------------------- gauges


async def test_the_census_follows_each_cohort_through_its_phases_without_walking_them(
    make: Make, clock: ManualClock, judge: ScriptedJudge, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await make(judge, clock)

    def walked() -> list[Cohort]:
        raise AssertionError("a scrape must not walk every active cohort")

    # What a census could walk: the group store's cohorts.
    monkeypatch.setattr(rt.shared, "active_keys", walked)

    async def phases() -> tuple[int, int]:
        census = await rt.refresh_census()
        return census.collecting, census.evaluating

    assert await phases() == (0, 0)
    first = [accepted(await rt.submit(sub(i, gid="a"))) for i in range(2)]
    accepted(await rt.submit(sub(0, gid="b")))
    assert await phases() == (2, 0)
    first.append(accepted(await rt.submit(sub(2, gid="a"))))  # "a" freezes
    assert await phases() == (1, 1)
    await until(lambda: len(judge.calls) == 3)
    for call in judge.calls:
        call.release(Verdict(3, 3, 3))
    await until(lambda: all(done(t) for t in first))
    assert await phases() == (1, 0)
    assert await rt.cancel_cohort(sub(0, gid="b").key, "test over")
    assert await phases() == (0, 0)
    assert (await rt.refresh_census()).tombstones == 2
    monkeypatch.undo()  # (the runtime's stop walks the store's keys)
