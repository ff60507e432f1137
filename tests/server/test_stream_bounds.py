"""StreamGroups: per-member isolation, bounded bookkeeping and the held-bytes bounds."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2

from genrm_grpc.server.app import CohortServer

from .conftest import PROMPT, StartServer, candidate, member

STREAM_TIMEOUT = 60


def _request(ref: pb.MemberRef, cand: pb.Candidate | None = None) -> pb.StreamGroupsRequest:
    return pb.StreamGroupsRequest(
        member=pb.SubmitMemberRequest(
            member=ref, prompt=PROMPT, candidate=cand or candidate(ref.rollout_index)
        )
    )


def _reason(event: pb.StreamGroupsResponse) -> tuple[int, str]:
    status = event.error.status
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return status.code, info.reason
    raise AssertionError(f"no ErrorInfo in {status}")


async def _outcome(call: Any) -> pb.StreamGroupsResponse:
    """The next result or error on the stream (skipping accepted and progress events)."""
    while True:
        event = await call.read()
        assert event is not grpc.aio.EOF, "the stream ended early"
        if event.WhichOneof("event") in ("result", "error"):
            return event  # type: ignore[no-any-return]


def _only_stream(server: CohortServer) -> Any:
    streams = list(server.servicer.open_streams)
    assert len(streams) == 1
    return streams[0]


def _nested(depth: int) -> str:
    return json.dumps({"output": [{"type": "message", "content": []}]})[:-1] + (
        ',"x":' + "[" * depth + "]" * depth + "}"
    )


async def test_deeply_nested_json_is_one_member_error_and_later_members_are_still_served(
    start_server: StartServer,
) -> None:
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.CohortServiceStub(channel).StreamGroups(timeout=STREAM_TIMEOUT)
        # Depths around the interpreter's recursion limit: deep enough to exhaust the
        # stack of some step of a member's handling once the handler's frames are on it.
        depths = [*range(940, 1001), 5000]
        for n, depth in enumerate(depths):
            ref = member(0, group=f"deep-{n}", size=1)
            await call.write(_request(ref, pb.Candidate(responses_api_json=_nested(depth))))
        await call.write(_request(member(0, group="after", size=1)))
        await call.done_writing()
        outcomes = [await _outcome(call) for _ in range(len(depths) + 1)]
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    for event in outcomes[:-1]:
        if event.WhichOneof("event") == "error":
            assert _reason(event) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "INVALID_MEMBER")
    last = outcomes[-1]
    assert last.WhichOneof("event") == "result"
    assert last.result.member.group_id == "after"


async def test_a_long_lived_stream_keeps_no_entry_for_groups_it_has_finished(
    start_server: StartServer,
) -> None:
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.CohortServiceStub(channel).StreamGroups(timeout=STREAM_TIMEOUT)
        for g in range(200):
            await call.write(_request(member(0, group=f"one-{g}", size=1)))
            assert (await _outcome(call)).WhichOneof("event") == "result"
        stream = _only_stream(server)
        # Still open, 200 groups carried: nothing of them is left on the stream.
        assert (stream.held_members, stream.held_bytes, stream.groups_held) == (0, 0, 0)
        assert server.servicer.held_by_connection == {}
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF


async def test_a_member_beyond_the_stream_byte_bound_is_refused_and_the_stream_stays_open(
    start_server: StartServer,
) -> None:
    # Each member below is ~2.1 KB on the wire + 1 KiB of bookkeeping: two fit in 8 KiB,
    # a third does not, a small one does.
    server, _ = await start_server(max_message_bytes=4096, stream_max_held_bytes=8 * 1024)
    answer = "x" * 2000
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.CohortServiceStub(channel).StreamGroups(timeout=STREAM_TIMEOUT)
        for k in range(2):
            await call.write(
                _request(member(k, group="big", size=3), pb.Candidate(output_text=answer + str(k)))
            )
            assert (await call.read()).WhichOneof("event") == "accepted"
        await call.write(
            _request(member(0, group="other", size=1), pb.Candidate(output_text=answer))
        )
        refused = await call.read()
        assert refused.WhichOneof("event") == "error"
        assert _reason(refused) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
            "CAPACITY_EXHAUSTED",
        )
        assert "stream_max_held_bytes" in refused.error.status.message
        census = await server.runtime.refresh_census()
        assert census.collecting == 1  # the refused member made no cohort
        # Completing the held group frees its bytes: the same member is now accepted.
        await call.write(
            _request(member(2, group="big", size=3), pb.Candidate(output_text="short"))
        )
        assert [(await _outcome(call)).WhichOneof("event") for _ in range(3)] == ["result"] * 3
        await call.write(
            _request(member(0, group="other", size=1), pb.Candidate(output_text=answer))
        )
        assert (await _outcome(call)).WhichOneof("event") == "result"
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


async def test_streams_of_one_connection_share_the_connection_byte_bound(
    start_server: StartServer,
) -> None:
    server, _ = await start_server(
        max_message_bytes=4096,
        stream_max_held_bytes=7 * 1024,
        connection_max_held_bytes=9 * 1024,
    )
    answer = "y" * 2000
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        first = stub.StreamGroups(timeout=STREAM_TIMEOUT)
        second = stub.StreamGroups(timeout=STREAM_TIMEOUT)
        for k in range(2):
            await first.write(
                _request(member(k, group="a", size=3), pb.Candidate(output_text=answer + str(k)))
            )
            assert (await first.read()).WhichOneof("event") == "accepted"
        await second.write(_request(member(0, group="b", size=2), pb.Candidate(output_text=answer)))
        refused = await second.read()
        assert refused.WhichOneof("event") == "error"
        assert "connection_max_held_bytes" in refused.error.status.message
        # The first stream's members are the connection's: the second stream holds none.
        assert sum(s.held_bytes for s in server.servicer.open_streams) == sum(
            server.servicer.held_by_connection.values()
        )
        first.cancel()
        second.cancel()


async def test_members_held_by_a_stream_cost_no_task_each(start_server: StartServer) -> None:
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.CohortServiceStub(channel).StreamGroups(timeout=STREAM_TIMEOUT)
        await call.write(_request(member(0, group="first", size=2)))
        assert (await call.read()).WhichOneof("event") == "accepted"
        before = len(asyncio.all_tasks())
        for g in range(200):  # groups that stay incomplete: every member is held
            await call.write(_request(member(0, group=f"held-{g}", size=2)))
            assert (await call.read()).WhichOneof("event") == "accepted"
        # The server shares this event loop: its tasks did not grow with the members held.
        assert len(asyncio.all_tasks()) - before < 10
        stream = _only_stream(server)
        assert stream.held_members == 201 and stream.groups_held == 201
        call.cancel()
