"""Fixtures: the fake judge (HTTP on loopback) for client and collector tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from tests.client.support import ClientLog, capture_client_log


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


@pytest.fixture
def client_log() -> Iterator[ClientLog]:
    with capture_client_log() as log:
        yield log
