"""The state gauges of replicas on one Redis: each reports the deployment's cohorts by
phase, tombstones and watermarks (they read 0 when they came from a replica's registry,
which holds one group at a time and none between)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import httpx
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from genrm_grpc.config import load_settings
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


@pytest.fixture
async def replicas(
    redis_url: str, fake_judge: FakeJudgeServer
) -> AsyncIterator[list[CohortServer]]:
    servers = []
    for _ in range(2):
        settings = load_settings(
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            judge={"url": fake_judge.url},
            store=redis_url,
            max_terminal_cohorts=2,
            shutdown_grace_s=0.1,
        )
        server = CohortServer(settings)
        await server.start()
        servers.append(server)
    yield servers
    for server in servers:
        await server.stop()


def _member(group: str, k: int, size: int) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(group_id=group, group_attempt=0, rollout_index=k, group_size=size),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=f"{k + 2} is a prime number, answer {k}."),
    )


async def _gauges(server: CohortServer) -> dict[tuple[str, str], float]:
    runtime = server.runtime
    assert isinstance(runtime, ReplicaRuntime)
    await runtime.refresh_census()  # what the store watcher does every STORE_CHECK_S
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
    found = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            found[(sample.name, sample.labels.get("phase", ""))] = sample.value
    return found


async def test_every_replica_reports_the_deployments_cohorts_tombstones_and_watermarks(
    replicas: list[CohortServer],
) -> None:
    first, second = replicas
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{first.port}") as a,
        grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as b,
    ):
        stubs = [pb_grpc.CohortServiceStub(a), pb_grpc.CohortServiceStub(b)]
        # Three groups of two complete, their members split over both replicas: with
        # max_terminal_cohorts = 2 the deployment retains two of their tombstones.
        for group in ("done-0", "done-1", "done-2"):
            await asyncio.gather(
                *(stubs[k].SubmitMember(_member(group, k, 2), timeout=30) for k in range(2))
            )
        # One group still collecting: one member of two, held on the first replica.
        stream = stubs[0].StreamGroups()
        await stream.write(pb.StreamGroupsRequest(member=_member("open", 0, 2)))
        event = await stream.read()
        assert event.WhichOneof("event") == "accepted"
        seen = [await _gauges(first), await _gauges(second)]
        stream.cancel()
    for gauges in seen:
        assert gauges[("genrm_cohorts", "collecting")] == 1
        assert gauges[("genrm_cohorts", "evaluating")] == 0
        assert gauges[("genrm_tombstones", "")] == 2
        assert gauges[("genrm_attempt_watermarks", "")] == 4
