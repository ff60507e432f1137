"""Answers wait for the store: nothing is sent before what it depends on is committed.

The store's writer is held back for real: the test holds SQLite's write lock on the
server's file from a second connection (``BEGIN IMMEDIATE``), so every commit waits
until the test lets go, exactly as a slow disk would make it wait.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient

from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeServer
from tests.server.conftest import StartServer

# The tests hold a SQLite file's write lock: they belong to that store alone. The runtime
# holds nothing of a decision until it is written.
pytestmark = pytest.mark.stores("sqlite")

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])


def _request(k: int) -> pb.StreamGroupsRequest:
    return pb.StreamGroupsRequest(
        member=pb.SubmitMemberRequest(
            member=pb.MemberRef(group_id="held", group_attempt=0, rollout_index=k, group_size=2),
            prompt=PROMPT,
            candidate=pb.Candidate(output_text=f"answer {k}: {2 * k + 3}"),
        )
    )


@contextmanager
def _write_lock(store: Path) -> Iterator[None]:
    conn = sqlite3.connect(store, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


async def _judging_a_group(
    start_server: StartServer, fake_judge: FakeJudgeServer, store: Path
) -> tuple[CohortServer, CohortClient, Any]:
    """A server on ``store`` judging a 2-member group sent on one stream; the passes hang
    at the judge. Returns the server, its client and the group's stream."""
    server, client = await start_server(store=f"sqlite:///{store}")
    group = client.stub.StreamGroups()
    fake_judge.set_faults(hang_rate=1.0)
    await group.write(_request(0))
    await group.write(_request(1))
    await group.done_writing()
    # Judging starts once the members are stored.
    assert await asyncio.to_thread(fake_judge.wait_for_requests, 2, 30)
    return server, client, group


async def test_an_outcome_the_file_cannot_take_yet_is_answered_once_it_is_written(
    start_server: StartServer, fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    store = tmp_path / "held.sqlite3"
    server, client, group = await _judging_a_group(start_server, fake_judge, store)
    with _write_lock(store):
        # The judge goes away: the hung passes fail and the group's end (masked) is
        # decided, but its commit cannot reach the file; it is tried again.
        await asyncio.to_thread(fake_judge.stop)
        for _ in range(3000):  # up to 30 s
            if server.runtime.stats()["store_failures"] >= 1:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the end of the group was never tried")
        assert not group.done()  # nothing answered from a commit the file lacks
    events = [e async for e in group]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("accepted") == 2 and kinds.count("result") == 2, kinds
    resend = client.stub.StreamGroups()
    await resend.write(_request(0))
    await resend.done_writing()
    second = [e async for e in resend]
    assert [e.WhichOneof("event") for e in second] == ["accepted", "result"]
    assert second[1].result.replayed and second[1].result.member.rollout_index == 0
