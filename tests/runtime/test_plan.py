"""Lazy judge planning: passes exist only for members that arrived; big cohorts never
freeze the loop; the arithmetic order equals the aggregation order of judge_passes."""

from __future__ import annotations

import asyncio
import itertools
import random
import tracemalloc

import pytest

from genrm_grpc.runtime.live import START_SLICE
from genrm_grpc.runtime.plan import PassPlan
from genrm_grpc.scoring import judge_passes
from genrm_grpc.testing import ManualClock

from .conftest import Make
from .support import ScriptedJudge, assert_no_leaks, sub

PLANS = [
    PassPlan(mode, strategy, judges, debias)
    for mode, strategy, judges, debias in itertools.product(
        ("rollout_cohort", "fixed_baseline"), ("circular", "all_pairs"), (1, 2, 3), (False, True)
    )
]


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_every_pass_has_its_aggregation_order_and_eager_arrivals_plan_each_exactly_once(
    plan: PassPlan,
) -> None:
    rng = random.Random(7)
    for n in range(1, 12):
        passes = list(plan.all_passes(n))
        assert [p.order for p in passes] == list(range(len(passes)))
        assert len(passes) == plan.pass_count(n)
        if plan.mode == "fixed_baseline":
            expected = [(m, n, k) for k in range(plan.judges) for m in range(n)]
        else:
            expected = judge_passes(n, plan.strategy, plan.judges)
        assert [(p.i, p.j, p.judge_index) for p in passes] == expected
        # Members arrive in any order; each pass is planned when its last member arrives.
        arrival = list(range(n))
        rng.shuffle(arrival)
        present: set[int] = set()
        planned = []
        for m in arrival:
            present.add(m)
            planned.extend(plan.passes_with(n, m, present))
        assert sorted(planned, key=lambda p: p.order) == passes


@pytest.mark.parametrize("schedule", ["after_collection", "eager"])
async def test_one_member_of_a_huge_declared_group_costs_memory_for_itself_only(
    make: Make, judge: ScriptedJudge, clock: ManualClock, schedule: str
) -> None:
    rt = await make(judge, clock, schedule=schedule)  # type: ignore[arg-type]
    first = sub(0, gid="warm", size=4)
    await rt.submit(first)  # warm up every code path and cache
    member = sub(0, gid="huge", size=4096)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ticket = await rt.submit(member)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert ticket.waiter is not None
    assert held < 32 * 1024, f"one member of a 4096 group holds {held} bytes"
    assert judge.calls == []
    await rt.cancel_cohort(member.key, "test over")
    await rt.cancel_cohort(first.key, "test over")
    await assert_no_leaks(rt, judge=judge)


async def test_a_large_complete_cohort_starts_its_passes_in_slices(
    make: Make, clock: ManualClock
) -> None:
    n = 4 * START_SLICE
    judge = ScriptedJudge(auto=True)
    rt = await make(judge, clock)
    members = [sub(k, gid="big", size=n) for k in range(n)]
    first = await rt.submit(members[0])
    assert first.waiter is not None
    for member in members[1:-1]:
        await rt.submit(member)
    started_when_others_ran: list[int] = []

    async def bystander() -> None:
        await asyncio.sleep(0)
        live = rt.judging.live[members[0].key]
        started_when_others_ran.append(len(live.pair_tasks))

    await rt.submit(members[-1])  # the cohort freezes; its evaluation task starts
    probe = asyncio.create_task(bystander())
    await probe
    assert started_when_others_ran[0] < n, "every pass was started in one step"
    outcome = await first.waiter.wait()
    assert len(getattr(outcome, "rewards", ())) == n
    assert len(judge.calls) == n
    await assert_no_leaks(rt, judge=judge)
