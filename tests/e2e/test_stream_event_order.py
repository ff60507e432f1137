"""StreamGroups events come in dependency order on every store, with an instant judge.

A real ``genrm-grpc serve`` process per store kind (``memory://``, a SQLite file, a real
``redis-server``), the fake judge answering at once over HTTP, one stream carrying
whole groups. For every member, ``accepted`` comes before any event that depends on it:
its ``result``, and every ``pair_judged`` of its group (with ``judge_schedule: eager``,
every ``pair_judged`` of a pair it is part of). The store is what makes the order hard:
a member is ``accepted`` once its record is durable, so judging may start only from
what a restart would see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.testing.redis_server import RedisServer
from tests.e2e.support import running
from tests.judge.processes import FakeJudgeProcess, RestartableServer

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
GROUPS = 12
SIZE = 4


def _requests() -> list[pb.StreamGroupsRequest]:
    return [
        pb.StreamGroupsRequest(
            member=pb.SubmitMemberRequest(
                member=pb.MemberRef(
                    group_id=f"order-{g}", group_attempt=0, rollout_index=k, group_size=SIZE
                ),
                prompt=PROMPT,
                candidate=pb.Candidate(output_text=f"{2 + 7 * k} is prime, says member {k}."),
            )
        )
        for g in range(GROUPS)
        for k in range(SIZE)
    ]


async def _stream(target: str) -> list[pb.StreamGroupsResponse]:
    async with grpc.aio.insecure_channel(target) as channel:
        call = pb_grpc.CohortServiceStub(channel).StreamGroups(iter(_requests()), timeout=120)
        events = [event async for event in call]
        assert await call.code() == grpc.StatusCode.OK
        return events


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess() as process:  # latency 0: answers at once
        yield process


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cohorts.db'}"
    else:
        with RedisServer(appendonly=True) as server:
            yield server.url


def _first_accepted(events: list[pb.StreamGroupsResponse]) -> dict[tuple[str, int], int]:
    at: dict[tuple[str, int], int] = {}
    for n, event in enumerate(events):
        if event.WhichOneof("event") == "accepted":
            ref = event.accepted.member
            at.setdefault((ref.group_id, ref.rollout_index), n)
    return at


@pytest.mark.parametrize("schedule", ["after_collection", "eager"])
def test_every_members_accepted_comes_before_the_events_that_depend_on_it(
    store: str, schedule: str, judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    server = RestartableServer(
        store,
        judge.url,
        tmp_path / "server.log",
        GENRM_JUDGE_SCHEDULE=schedule,
        GENRM_JUDGE_MAX_CONCURRENCY="64",
    )
    with running([server]):
        events = asyncio.run(_stream(server.target))

    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("error") == 0, [e.error for e in events if e.WhichOneof("event") == "error"]
    assert kinds.count("accepted") == kinds.count("result") == GROUPS * SIZE
    accepted = _first_accepted(events)
    late: list[str] = []
    for n, event in enumerate(events):
        kind = event.WhichOneof("event")
        if kind == "result":
            ref = event.result.member
            depends_on = [(ref.group_id, ref.rollout_index)]
        elif kind == "pair_judged":
            pair = event.pair_judged
            group = pair.member.group_id
            members = (pair.response_i, pair.response_j) if schedule == "eager" else range(SIZE)
            depends_on = [(group, k) for k in members]
        else:
            continue
        late += [
            f"{kind} #{n} before accepted of {member}"
            for member in depends_on
            if accepted.get(member, len(events)) > n
        ]
    assert not late, late[:10]
