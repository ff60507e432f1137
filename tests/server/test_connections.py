"""Connection lifetime and the wait cap of calls without a client deadline (real gRPC)."""

from __future__ import annotations

import asyncio

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import error_info

from genrm_grpc.testing import FakeJudgeServer

from .conftest import PROMPT, StartServer, candidate, member

READY = grpc.ChannelConnectivity.READY


async def test_a_call_without_a_deadline_gets_a_typed_expiry_and_its_member_stays(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server, _ = await start_server(max_call_wait_s=0.3)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        request = pb.SubmitMemberRequest(member=member(0), prompt=PROMPT, candidate=candidate(0))
        try:
            await stub.SubmitMember(request)  # no deadline: the group never fills
        except grpc.RpcError as exc:
            err = error_info(exc)
        else:
            raise AssertionError("a call without a deadline waited forever")
        assert (err.code, err.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "CALL_WAIT_EXPIRED")
        assert err.metadata["groupId"] == "g1" and err.metadata["rolloutIndex"] == "0"
        info = await stub.GetCohort(pb.GetCohortRequest(member=member(0)), timeout=5)
        assert list(info.cohort.present_indices) == [0]
        assert server.runtime.stats()["waiters"] == 0
        # With a client deadline the cap does not apply: the group completes.
        calls = [
            stub.SubmitMember(
                pb.SubmitMemberRequest(member=member(k), prompt=PROMPT, candidate=candidate(k)),
                timeout=30,
            )
            for k in range(4)
        ]
        results = await asyncio.gather(*calls)
        assert all(not r.result.mask_sample for r in results)
    assert fake_judge.stats()["total"] == 4


async def test_a_compare_without_a_deadline_is_capped_too(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(hang_rate=1.0)
    server, _ = await start_server(max_call_wait_s=0.3)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        try:
            await stub.Compare(pb.CompareRequest(prompt=PROMPT, candidates=[candidate(0)] * 2))
        except grpc.RpcError as exc:
            err = error_info(exc)
        else:
            raise AssertionError("the hanging judge answered")
    assert (err.code, err.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "CALL_WAIT_EXPIRED")
    await server.runtime.drain_tasks()  # the judge calls were cancelled, not left behind
    fake_judge.set_faults(hang_rate=0.0)


async def _ready_channel(port: int) -> grpc.aio.Channel:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await asyncio.wait_for(channel.channel_ready(), 10)
    return channel


async def test_an_idle_connection_is_closed_after_max_connection_idle_s(
    start_server: StartServer,
) -> None:
    server, _ = await start_server(max_connection_idle_s=0.2)
    channel = await _ready_channel(server.port)
    try:
        await asyncio.wait_for(channel.wait_for_state_change(READY), 10)
        assert channel.get_state() != READY
    finally:
        await channel.close()


async def test_an_old_connection_gets_goaway_after_max_connection_age_s(
    start_server: StartServer,
) -> None:
    server, _ = await start_server(max_connection_age_s=0.2, max_connection_age_grace_s=0.2)
    channel = await _ready_channel(server.port)
    try:
        await asyncio.wait_for(channel.wait_for_state_change(READY), 10)
        assert channel.get_state() != READY
    finally:
        await channel.close()
