"""Compare shares the judge bound fairly with cohorts, and its queue is bounded."""

from __future__ import annotations

import asyncio

import pytest

from genrm_grpc.cohort.identity import CandidateInput, candidate_spec
from genrm_grpc.cohort.model import CandidateSpec, Completed
from genrm_grpc.runtime.live import CompareCapacityError
from genrm_grpc.testing import ManualClock

from .conftest import Make
from .support import PROMPT, ScriptedJudge, assert_no_leaks, sub, until


def _candidates(n: int, tag: str = "cmp") -> list[CandidateSpec]:
    specs = [candidate_spec(CandidateInput(output_text=f"{tag} answer {k}")) for k in range(n)]
    assert all(isinstance(s, CandidateSpec) for s in specs)
    return specs  # type: ignore[return-value]


async def test_a_cohort_ready_during_a_large_compare_is_judged_between_its_passes(
    make: Make, judge: ScriptedJudge, clock: ManualClock
) -> None:
    rt = await make(judge, clock, concurrency=1)
    compare = asyncio.create_task(rt.compare(PROMPT, _candidates(8)))  # 8 circular passes
    await until(lambda: len(judge.calls) == 1)  # the compare holds the only permit
    tickets = [await rt.submit(sub(k, gid="train", size=2)) for k in range(2)]  # 2 passes
    await until(lambda: rt.stats()["judge_waiting"] == 7 + 2)  # all passes queued
    order = []
    for n in range(10):  # one permit: call n starts only after call n-1 finished
        await until(lambda n=n: len(judge.calls) == n + 1)  # type: ignore[misc]
        call = judge.calls[n]
        order.append("cohort" if "train" in call.inp.response_1 else "compare")
        call.release()
    assert order[:3] == ["compare", "cohort", "cohort"], order
    outcomes = [await t.waiter.wait() for t in tickets if t.waiter is not None]
    assert all(isinstance(o, Completed) for o in outcomes)
    assert len((await compare).rewards) == 8
    await assert_no_leaks(rt, judge=judge)


async def test_compares_beyond_the_queued_pass_bound_are_refused_and_counted_back(
    make: Make, judge: ScriptedJudge, clock: ManualClock
) -> None:
    rt = await make(judge, clock, concurrency=1, max_queued_compare_passes=10)
    big = asyncio.create_task(rt.compare(PROMPT, _candidates(12, "big")))  # alone: admitted
    await until(lambda: len(judge.calls) == 1)
    with pytest.raises(CompareCapacityError, match="max_queued_compare_passes=10"):
        await rt.compare(PROMPT, _candidates(2))
    assert rt.stats()["compare_passes"] == 12
    judge.auto = True
    judge.release_all()
    await big
    assert rt.stats()["compare_passes"] == 0
    small = await rt.compare(PROMPT, _candidates(4))  # admitted again
    assert len(small.rewards) == 4
    await assert_no_leaks(rt, judge=judge)
