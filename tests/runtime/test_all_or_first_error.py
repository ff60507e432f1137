"""The evaluation's wait for its pair tasks: results in order, or the first failure.

Each task waits on its own event, so the test decides the order in which they finish.
"""

from __future__ import annotations

import asyncio

import pytest

from genrm_grpc.judge.client import JudgeFailedError
from genrm_grpc.runtime.live import PairResult, all_or_first_error
from genrm_grpc.scoring.types import JudgedPair, Verdict

from .support import settle


class Pairs:
    """n pair tasks; ``finish(k)`` completes task k, ``fail(k)`` fails it."""

    def __init__(self, n: int) -> None:
        self.gates = [asyncio.Event() for _ in range(n)]
        self.errors: list[BaseException | None] = [None] * n
        self.cancelled: list[int] = []
        self.tasks = [asyncio.ensure_future(self._pair(k)) for k in range(n)]

    async def _pair(self, k: int) -> PairResult:
        try:
            await self.gates[k].wait()
        except asyncio.CancelledError:
            self.cancelled.append(k)
            raise
        error = self.errors[k]
        if error is not None:
            raise error
        return PairResult(JudgedPair(k, k + 1, 0, Verdict(float(k), 1.0, 1.0)), None)

    def finish(self, k: int) -> None:
        self.gates[k].set()

    def fail(self, k: int, error: BaseException) -> None:
        self.errors[k] = error
        self.gates[k].set()


async def test_results_come_in_task_order_whatever_order_the_tasks_finish_in() -> None:
    pairs = Pairs(5)
    waiting = asyncio.ensure_future(all_or_first_error(pairs.tasks))
    for k in (3, 0, 4, 1):
        pairs.finish(k)
        await settle()
        assert not waiting.done()
    pairs.finish(2)
    results = await waiting
    assert [r.pair.response_i for r in results] == [0, 1, 2, 3, 4]


async def test_no_tasks_give_no_results() -> None:
    assert await all_or_first_error([]) == []


async def test_the_first_failure_cancels_and_awaits_the_rest_then_is_raised() -> None:
    pairs = Pairs(4)
    pairs.finish(0)
    waiting = asyncio.ensure_future(all_or_first_error(pairs.tasks))
    await settle()
    first = JudgeFailedError("judge failed: HTTP 503")
    pairs.fail(2, first)
    with pytest.raises(JudgeFailedError) as raised:
        await waiting
    assert raised.value is first
    assert sorted(pairs.cancelled) == [1, 3]
    assert all(task.done() for task in pairs.tasks)  # awaited before the raise


async def test_a_cancelled_pair_does_not_end_the_wait_early_and_surfaces_at_the_end() -> None:
    pairs = Pairs(3)
    waiting = asyncio.ensure_future(all_or_first_error(pairs.tasks))
    pairs.tasks[1].cancel()
    await settle()
    assert not waiting.done()
    pairs.finish(0)
    pairs.finish(2)
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_cancelling_the_wait_cancels_and_awaits_every_pair() -> None:
    pairs = Pairs(3)
    pairs.finish(1)
    waiting = asyncio.ensure_future(all_or_first_error(pairs.tasks))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert sorted(pairs.cancelled) == [0, 2]
    assert all(task.done() for task in pairs.tasks)
