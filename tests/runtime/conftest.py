"""Fixtures for the runtime tests: a manual clock, a scripted judge, and runtimes over
the in-process group store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from genrm_grpc.testing import ManualClock

from .support import (
    Runtime,
    ScriptedJudge,
    close_runtime,
    make_runtime,
    open_runtime,
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


@pytest.fixture
def judge() -> ScriptedJudge:
    return ScriptedJudge()


Make = Callable[..., Awaitable[Runtime]]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """``await make(judge, clock, **settings)``: a runtime, opened; stopped when the test
    ends."""
    made: list[Runtime] = []

    async def build(judge: ScriptedJudge, clock: ManualClock, **kw: Any) -> Runtime:
        runtime = await open_runtime(make_runtime(judge, clock, **kw))
        made.append(runtime)
        return runtime

    yield build
    for runtime in made:
        await close_runtime(runtime)
