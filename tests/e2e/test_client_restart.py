"""The client against a real ``genrm-grpc serve`` process that drains and restarts.

A member waits for its cohort; the server process gets SIGTERM (the default SQLite store
keeps the cohort: ``UNAVAILABLE`` / ``SHUTTING_DOWN``) and is started again on the same
port and file. The client must not wait silently: it warns, counts the retry, notices
the new server instance, and the member reattaches to its cohort.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from genrm_cohort_client import ChannelOptions, CohortClient, RetryPolicy

from tests.client.support import ClientLog, capture_client_log
from tests.judge.processes import FakeJudgeProcess, RestartableServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def client_log() -> Iterator[ClientLog]:
    with capture_client_log() as log:
        yield log


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess(None) as process:
        yield process


def _instances(log: Path) -> list[str]:
    """The instance ids of the ``serving`` lines the server processes wrote."""
    ids = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("msg") == "serving":
                ids.append(record["instance"])
    return ids


async def test_a_member_waiting_through_a_server_restart_warns_and_then_gets_its_reward(
    judge: FakeJudgeProcess,
    tmp_path: Path,
    client_log: ClientLog,
) -> None:
    store = tmp_path / "state.sqlite3"
    server = RestartableServer(
        f"sqlite:///{store}", judge.url, tmp_path / "server.log", GENRM_SHUTDOWN_GRACE_S="0.2"
    )
    options = ChannelOptions(initial_reconnect_backoff_ms=50, max_reconnect_backoff_ms=200)
    policy = RetryPolicy(initial_backoff_s=0.05, jitter_s=0.0, warn_every_s=0.2)
    member = {"group_id": "through-restart", "group_attempt": 0, "group_size": 2}
    try:
        await asyncio.to_thread(server.start)
        async with CohortClient(server.target, options=options, retry=policy) as client:
            waiting = asyncio.create_task(
                client.submit_member({**member, "rollout_index": 0}, "2+2?", "four")
            )
            await client_log.wait_for("answered by server instance")
            assert await asyncio.to_thread(server.stop) == 0  # drained
            first = await client_log.wait_for("resending after UNAVAILABLE/SHUTTING_DOWN")
            await client_log.wait_for("waiting for the server to come back")
            assert not waiting.done()

            await asyncio.to_thread(server.start)
            other = await client.submit_member({**member, "rollout_index": 1}, "2+2?", "five")
            result = await waiting
            stats = client.stats
    finally:
        await asyncio.to_thread(server.close)
    assert first.levelno == logging.WARNING
    assert "SubmitMember group_id='through-restart' group_attempt=0 rollout_index=0" in (
        first.getMessage()
    )
    assert not result.mask_sample and not other.mask_sample
    assert {result.member.rollout_index, other.member.rollout_index} == {0, 1}
    assert stats.retries_by_reason.get("UNAVAILABLE/SHUTTING_DOWN", 0) >= 1
    assert set(stats.retries_by_reason) <= {"UNAVAILABLE/SHUTTING_DOWN", "UNAVAILABLE"}
    assert stats.gave_up == 0 and stats.server_instance_changes == 1
    before, after = _instances(tmp_path / "server.log")
    assert before != after and stats.server_instance == after
    changed = client_log.matching("is another process now")
    assert len(changed) == 1 and changed[0].levelno == logging.WARNING
    assert f"instance {after}, was {before}" in changed[0].getMessage()
