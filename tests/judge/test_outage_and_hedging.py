"""Outage tolerance and hedging against a real fake-judge process.

Backoff waits go through an injected ``sleep`` that records them and, at a chosen wait,
restarts the judge; the outage window runs on an injected clock. Nothing here waits for
a timer to prove a point, except the hedge and timeout delays themselves (short, and no
assertion depends on how long anything took).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeClient, JudgeFailedError, JudgeInput
from tests.judge.processes import FakeJudgeProcess
from tests.judge.views import judge_settings

INPUT = JudgeInput(
    messages=(("user", "Name the largest planet."),),
    response_1="Jupiter is the largest planet.",
    response_2="Mars.",
)


class Waits:
    """Records backoff waits, advances a manual clock by each, runs a hook per wait."""

    def __init__(self, hook: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.waits: list[float] = []
        self.now = 0.0
        self._hook = hook

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
        if self._hook is not None:
            await self._hook(len(self.waits))


def _config(url: str, **overrides: Any) -> Settings:
    """The clients of this module also get ``connect_retries=0``."""
    settings: dict[str, Any] = {
        "api": "responses",
        "model": "genrm",
        "genrm_parse_retries": 1,
        "genrm_parse_retry_sleep_s": 0.1,
        "max_retry_sleep_s": 0.4,
        "judge_request_timeout_s": 10.0,
    }
    return judge_settings(url, **{**settings, **overrides})


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    process = FakeJudgeProcess().start()
    try:
        yield process
    finally:
        process.stop()


async def _restart_scenario(judge: FakeJudgeProcess, tolerance: float) -> tuple[Any, Waits]:
    """One good call, then the judge goes down; it comes back during the 3rd backoff."""

    async def restart_on_third_wait(count: int) -> None:
        if count == 3:
            await asyncio.to_thread(judge.start)

    waits = Waits(restart_on_third_wait)
    config = _config(judge.url, judge_outage_tolerance_s=tolerance)
    async with JudgeClient(
        config, connect_retries=0, sleep=waits.sleep, clock=waits.clock, random=lambda: 1.0
    ) as client:
        first = await client.judge(INPUT)  # leaves a keep-alive connection in the pool
        assert first.attempts == 1
        await asyncio.to_thread(judge.stop)
        try:
            outcome: Any = await client.judge(INPUT)
        except JudgeFailedError as exc:
            outcome = exc
    return outcome, waits


async def test_outage_tolerance_rides_out_a_judge_restart_without_spending_the_budget(
    judge: FakeJudgeProcess,
) -> None:
    outcome, waits = await _restart_scenario(judge, tolerance=60.0)

    assert not isinstance(outcome, JudgeFailedError)
    assert not outcome.verdict.parse_failed
    # 3 failed attempts while the judge was down, then the answer: more attempts than
    # the budget of genrm_parse_retries=1 (2 attempts) allows.
    assert outcome.attempts == 4
    assert len(waits.waits) == 3
    assert judge.stats()["by_outcome"] == {"ok": 1}


async def test_without_outage_tolerance_a_judge_restart_masks_after_the_budget(
    judge: FakeJudgeProcess,
) -> None:
    outcome, waits = await _restart_scenario(judge, tolerance=0.0)

    assert isinstance(outcome, JudgeFailedError)
    assert "after 2 attempt(s)" in outcome.reason
    assert len(waits.waits) == 1


async def test_outage_retries_spend_the_budget_once_the_window_is_over() -> None:
    down = FakeJudgeProcess()  # never started: nothing listens on its port
    waits = Waits()
    config = _config(
        down.url, judge_outage_tolerance_s=1.0, genrm_parse_retry_sleep_s=0.6, max_retry_sleep_s=0.6
    )
    async with JudgeClient(
        config, connect_retries=0, sleep=waits.sleep, clock=waits.clock, random=lambda: 1.0
    ) as client:
        with pytest.raises(JudgeFailedError) as excinfo:
            await client.judge(INPUT)

    # t=0 and t=0.6 are inside the 1 s window (free); t=1.2 and t=1.8 spend the budget.
    assert waits.waits == pytest.approx([0.6, 0.6, 0.6])
    assert "after 4 attempt(s)" in excinfo.value.reason
    assert "transport×4" in excinfo.value.reason


async def test_http_503_bursts_are_covered_by_the_outage_tolerance() -> None:
    with FakeJudgeProcess(None, "--fail-503-first-n", "3") as judge:
        waits = Waits()
        config = _config(judge.url, genrm_parse_retries=0, judge_outage_tolerance_s=30.0)
        async with JudgeClient(
            config, connect_retries=0, sleep=waits.sleep, clock=waits.clock
        ) as client:
            outcome = await client.judge(INPUT)
        stats = judge.stats()

    assert outcome.attempts == 4
    assert stats["by_outcome"] == {"fail_503": 3, "ok": 1}


async def test_a_timed_out_request_is_retried_within_the_outage_tolerance() -> None:
    with FakeJudgeProcess(None, "--hang-first-n", "1") as judge:
        waits = Waits()
        config = _config(
            judge.url,
            genrm_parse_retries=0,
            judge_outage_tolerance_s=30.0,
            judge_request_timeout_s=0.3,
        )
        async with JudgeClient(
            config, connect_retries=0, sleep=waits.sleep, clock=waits.clock
        ) as client:
            outcome = await client.judge(INPUT)
        stats = judge.stats()

    assert outcome.attempts == 2
    assert not outcome.verdict.parse_failed
    assert stats["total"] == 2


async def test_a_hung_request_is_hedged_and_the_hedge_answers() -> None:
    hedges: list[int] = []
    with FakeJudgeProcess(None, "--hang-first-n", "1") as judge:
        config = _config(
            judge.url, genrm_parse_retries=0, judge_hedge_after_s=0.2, judge_request_timeout_s=30.0
        )
        async with JudgeClient(
            config, connect_retries=0, on_hedge=lambda: hedges.append(1)
        ) as client:
            outcome = await client.judge(INPUT)
        stats = judge.stats()

    assert outcome.attempts == 1
    assert not outcome.verdict.parse_failed
    assert hedges == [1]
    assert stats["total"] == 2  # the hung request and its hedge
    assert stats["by_outcome"] == {"hang": 1, "ok": 1}


async def test_a_prompt_answer_is_not_hedged(judge: FakeJudgeProcess) -> None:
    hedges: list[int] = []
    config = _config(judge.url, judge_hedge_after_s=5.0)
    async with JudgeClient(config, connect_retries=0, on_hedge=lambda: hedges.append(1)) as client:
        outcome = await client.judge(INPUT)

    assert outcome.attempts == 1
    assert hedges == []
    assert judge.stats()["total"] == 1
