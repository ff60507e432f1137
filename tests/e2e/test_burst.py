"""A burst of thousands of concurrent SubmitMember calls on one channel all complete.

grpc-core keeps calls that arrived but that the server has not picked up yet in a
pending queue, and past ``grpc.server.max_pending_requests`` (1,000 by default, 3,000
the hard limit) it refuses further calls with a bare ``CANCELLED``. A collector that
sends each member of a step as its own unary call hits that queue at once: the refused
members never reach a cohort, and their groups wait until the collection deadline. The
server sets both limits from ``max_pending_rpcs``. A real ``genrm-grpc serve`` process,
the fake judge process, one client channel.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from tests.e2e.support import running
from tests.judge.processes import FakeJudgeProcess, RestartableServer

# On each kind of store (tests/store_kinds.py): the server process inherits GENRM_STORE.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("store_of_kind")]

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
GROUPS = 256
SIZE = 16


def _request(group: int, k: int) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(
            group_id=f"burst-{group}", group_attempt=0, rollout_index=k, group_size=SIZE
        ),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=f"{2 + 7 * k} is prime, says member {k}."),
    )


async def _burst(target: str) -> Counter[str]:
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)

        async def one(group: int, k: int) -> None:
            try:
                await stub.SubmitMember(_request(group, k), timeout=300)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1

        await asyncio.gather(*(one(g, k) for g in range(GROUPS) for k in range(SIZE)))
    return codes


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess() as process:
        yield process


def test_a_burst_of_4096_concurrent_members_on_one_channel_all_get_their_rewards(
    judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    server = RestartableServer(
        os.environ["GENRM_STORE"],
        judge.url,
        tmp_path / "server.log",
        GENRM_JUDGE_MAX_CONCURRENCY="64",
        GENRM_MAX_CONCURRENT_STREAMS=str(GROUPS * SIZE),
    )
    with running([server]):
        codes = asyncio.run(_burst(server.target))
    assert codes == Counter({"OK": GROUPS * SIZE})
