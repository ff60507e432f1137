"""Time in the runtime is its clock: deadlines are the in-process store's timers
(no sweep polls for them); leases count in the store's lease clock (the same one unless
a test gives another; the loop's monotonic clock in service). A ManualClock drives it."""

from __future__ import annotations

from genrm_grpc.cohort.model import Failed, Masked, Phase
from genrm_grpc.cohort.registry import Disposition
from genrm_grpc.config import Settings
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.testing import ManualClock

from .support import (
    COLLECTION_S,
    EVALUATION_S,
    ScriptedJudge,
    advance,
    assert_no_leaks,
    close_runtime,
    make_runtime,
    open_runtime,
    phase_of,
    settle,
    sub,
    until,
)


async def _opened(judge: ScriptedJudge, clock: ManualClock) -> ReplicaRuntime:
    return await open_runtime(make_runtime(judge, clock))


async def test_a_collection_deadline_fires_at_the_deadline_and_not_before(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    rt = await _opened(judge, clock)
    try:
        ticket = await rt.submit(sub(0))
        assert ticket.disposition is Disposition.ACCEPTED and ticket.waiter is not None
        await advance(clock, COLLECTION_S - 0.001)
        assert not ticket.waiter.future.done()
        assert await phase_of(rt, sub(0).key) is Phase.COLLECTING
        await advance(clock, 0.001)  # the timer itself, not a sweep's next turn
        outcome = ticket.waiter.future.result()
        assert isinstance(outcome, Failed) and "collection deadline" in outcome.reason
        await assert_no_leaks(rt, judge=judge)
    finally:
        await close_runtime(rt)


async def test_a_frozen_cohort_keeps_one_timer_at_its_evaluation_deadline(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    """The collection deadline's timer goes when the cohort freezes: passing it ends
    nothing, and the evaluation deadline still fires on time."""
    rt = await _opened(judge, clock)
    try:
        await advance(clock, 10)
        tickets = [await rt.submit(sub(i)) for i in range(3)]
        await until(lambda: len(judge.calls) == 3)
        assert isinstance(rt.shared, LocalGroups)
        assert rt.shared.state.deadline_timers() == 1
        await advance(clock, EVALUATION_S - 1)
        assert not any(t.waiter is not None and t.waiter.future.done() for t in tickets)
        await advance(clock, 1)
        assert tickets[0].waiter is not None
        assert isinstance(tickets[0].waiter.future.result(), Masked)
        await advance(clock, COLLECTION_S)  # where the collection deadline was
        await assert_no_leaks(rt, judge=judge)
    finally:
        await close_runtime(rt)


async def test_an_ended_cohort_leaves_no_deadline_timer_and_its_deadline_asks_nothing(
    clock: ManualClock,
) -> None:
    judge = ScriptedJudge(auto=True)
    rt = await _opened(judge, clock)
    try:
        tickets = [await rt.submit(sub(i)) for i in range(3)]
        assert tickets[0].waiter is not None
        await tickets[0].waiter.wait()
        commits = rt.stats()["group_commits"]
        await advance(clock, COLLECTION_S + EVALUATION_S)
        await settle()
        assert rt.stats()["group_commits"] == commits  # no decision was asked for
        assert (await rt.submit(sub(0))).disposition is Disposition.REPLAYED
        await assert_no_leaks(rt, judge=judge)
    finally:
        await close_runtime(rt)


async def test_an_evaluation_lease_expires_on_the_stores_clock() -> None:
    clock = ManualClock()
    settings = Settings(store="memory://")
    groups = LocalGroups(settings, lease_s=10, clock=clock)
    key = sub(0).key
    lease = await groups.claim(key)
    assert lease is not None and groups.holds(lease)
    assert await groups.claim(key) is None
    clock.advance(9.9)
    renewed = await groups.renew(key, lease)
    assert renewed is not None and renewed.valid_until == clock.now() + 10
    clock.advance(10)
    assert not groups.holds(renewed) and await groups.renew(key, renewed) is None
    taken = await groups.claim(key)
    assert taken is not None and taken.token > lease.token


async def test_a_step_of_the_wall_clock_does_not_take_over_a_running_evaluation() -> None:
    """A lease counts in the lease clock (monotonic in service): the wall clock jumping
    three leases ahead (an NTP step) fires the sweeps and the renewals, but leaves the
    evaluation with the task running it. Each pair is judged once, and the rewards are
    the judge's."""
    clock, lease_clock = ManualClock(), ManualClock()
    judge = ScriptedJudge()
    made = make_runtime(
        judge,
        clock,
        lease_clock=lease_clock,
        collection_s=1000,
        evaluation_s=1000,
        replica_lease_s=10,
    )
    rt = await open_runtime(made)
    try:
        tickets = [await rt.submit(sub(i)) for i in range(3)]
        await until(lambda: len(judge.calls) == 3)
        await advance(clock, 30)  # one step, the lease clock standing
        for _ in range(8):  # the sweeps and renewals after it
            await advance(clock, 0.5)
        assert rt.stats()["takeovers"] == 0 and rt.stats()["leases_lost"] == 0
        judge.release_all()
        assert tickets[0].waiter is not None
        outcome = await tickets[0].waiter.wait()
        assert not isinstance(outcome, Failed | Masked), outcome
        assert len(judge.calls) == 3
        await assert_no_leaks(rt, judge=judge)
    finally:
        await close_runtime(rt)
