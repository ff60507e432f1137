"""Fixtures: the fake judge (HTTP on loopback) for client and collector tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge
