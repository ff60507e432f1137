"""Every CohortService answer names the server process that gave it: in its trailing
metadata always, and in its initial metadata before the call waits (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.server.servicer import SERVER_INSTANCE_METADATA

from .conftest import PROMPT, StartServer, candidate, member


def _instance(metadata: Any) -> str | None:
    return dict(metadata or ()).get(SERVER_INSTANCE_METADATA)


async def _trailers(port: int) -> dict[str, str | None]:
    """The instance id each RPC's trailing metadata carries, answered or refused."""
    seen: dict[str, str | None] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        calls = {
            # Refused (no group_size anywhere is fine; a blank group id is not).
            "SubmitMember refused": stub.SubmitMember(
                pb.SubmitMemberRequest(
                    member=pb.MemberRef(group_id=" ", rollout_index=0, group_size=2),
                    prompt=PROMPT,
                    candidate=candidate(0),
                ),
                timeout=10,
            ),
            # Answered in its own decision: a 1-member cohort.
            "SubmitMember answered": stub.SubmitMember(
                pb.SubmitMemberRequest(
                    member=member(0, group="alone", size=1), prompt=PROMPT, candidate=candidate(0)
                ),
                timeout=10,
            ),
            "Compare refused": stub.Compare(
                pb.CompareRequest(prompt=PROMPT, candidates=[candidate(0), candidate(1)]),
                timeout=10,
            ),
            "GetCohort refused": stub.GetCohort(
                pb.GetCohortRequest(member=pb.MemberRef(group_id="nobody")), timeout=10
            ),
        }
        for name, call in calls.items():
            with contextlib.suppress(grpc.RpcError):  # a refusal carries the id as well
                await call
            seen[name] = _instance(await call.trailing_metadata())
        refused = pb.SubmitMemberRequest(member=member(0, group=" "), prompt=PROMPT)
        stream = stub.StreamGroups(iter([pb.StreamGroupsRequest(member=refused)]), timeout=10)
        async for _ in stream:
            pass
        seen["StreamGroups"] = _instance(await stream.trailing_metadata())
    return seen


async def test_every_cohort_rpc_names_its_server_in_the_trailers_and_a_new_process_mints_another(
    start_server: StartServer,
) -> None:
    first, _ = await start_server()
    second, _ = await start_server(store="memory://")  # one store file serves one server
    seen = await _trailers(first.port)
    assert len(seen) == 5
    assert set(seen.values()) == {first.servicer.instance_id}
    assert len(first.servicer.instance_id) == 16
    assert set((await _trailers(second.port)).values()) == {second.servicer.instance_id}
    assert first.servicer.instance_id != second.servicer.instance_id


async def test_a_call_that_waits_gets_the_instance_id_before_its_answer(
    start_server: StartServer,
) -> None:
    server, _ = await start_server()
    expected = server.servicer.instance_id
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        # A member of a 2-member cohort waits for its sibling: its initial metadata
        # arrives while it waits, before anything answers it. (Called as unary-stream,
        # as the client package does: grpc.aio's unary-unary call shows the initial
        # metadata only with the answer.)
        submit = channel.unary_stream(
            "/genrm.cohort.v1.CohortService/SubmitMember",
            request_serializer=pb.SubmitMemberRequest.SerializeToString,
            response_deserializer=pb.SubmitMemberResponse.FromString,
        )
        first = submit(
            pb.SubmitMemberRequest(member=member(0, size=2), prompt=PROMPT, candidate=candidate(0)),
            timeout=10,
        )
        assert _instance(await asyncio.wait_for(first.initial_metadata(), 5)) == expected
        assert not first.done()
        # A stream gets it at once, before it reads a request.
        stream = stub.StreamGroups(timeout=10)
        assert _instance(await asyncio.wait_for(stream.initial_metadata(), 5)) == expected
        await stream.done_writing()
        async for _ in stream:
            pass
        first.cancel()


async def test_a_call_answered_in_its_own_decision_sends_no_separate_initial_metadata(
    start_server: StartServer,
) -> None:
    """One gRPC batch fewer per 1-member call (docs/performance.md §2): its answer
    carries empty initial metadata, the id is in the trailers."""
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        call = stub.SubmitMember(
            pb.SubmitMemberRequest(member=member(0, size=1), prompt=PROMPT, candidate=candidate(0)),
            timeout=10,
        )
        await call
        assert _instance(await call.initial_metadata()) is None
        assert _instance(await call.trailing_metadata()) == server.servicer.instance_id
