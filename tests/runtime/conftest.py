"""Fixtures for the runtime tests: a manual clock, a scripted judge, and runtimes of
both kinds (``runtime_kind``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from genrm_grpc.testing import ManualClock

from .support import (
    RUNTIME_KINDS,
    Runtime,
    RuntimeKind,
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


@pytest.fixture(params=RUNTIME_KINDS)
def runtime_kind(request: pytest.FixtureRequest) -> RuntimeKind:
    """Each test that takes it runs on both runtimes (ids ``[registry]``, ``[groups]``)."""
    kind: RuntimeKind = request.param
    return kind


Make = Callable[..., Awaitable[Runtime]]


@pytest.fixture
async def make(runtime_kind: RuntimeKind) -> AsyncIterator[Make]:
    """``await make(judge, clock, **settings)``: a runtime of this test's kind, opened;
    stopped when the test ends."""
    made: list[Runtime] = []

    async def build(judge: ScriptedJudge, clock: ManualClock, **kw: Any) -> Runtime:
        runtime = await open_runtime(make_runtime(judge, clock, kind=runtime_kind, **kw))
        made.append(runtime)
        return runtime

    yield build
    for runtime in made:
        await close_runtime(runtime)
