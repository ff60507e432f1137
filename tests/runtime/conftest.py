"""Fixtures for the runtime tests: a manual clock and a scripted judge."""

from __future__ import annotations

import pytest

from genrm_grpc.testing import ManualClock

from .support import ScriptedJudge


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


@pytest.fixture
def judge() -> ScriptedJudge:
    return ScriptedJudge()
