"""Every CohortService answer names the server process that gave it (initial metadata)."""

from __future__ import annotations

import contextlib

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.server.servicer import SERVER_INSTANCE_METADATA

from .conftest import PROMPT, StartServer, candidate, member


async def _instances(port: int) -> dict[str, str | None]:
    """The instance id each RPC's initial metadata carries, answered or refused."""
    seen: dict[str, str | None] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        calls = {
            # Refused (no group_size anywhere is fine; a blank group id is not).
            "SubmitMember": stub.SubmitMember(
                pb.SubmitMemberRequest(
                    member=pb.MemberRef(group_id=" ", rollout_index=0, group_size=2),
                    prompt=PROMPT,
                    candidate=candidate(0),
                ),
                timeout=10,
            ),
            "Compare": stub.Compare(
                pb.CompareRequest(prompt=PROMPT, candidates=[candidate(0), candidate(1)]),
                timeout=10,
            ),
            "GetCohort": stub.GetCohort(
                pb.GetCohortRequest(member=pb.MemberRef(group_id="nobody")), timeout=10
            ),
        }
        for name, call in calls.items():
            metadata = await call.initial_metadata()
            seen[name] = dict(metadata).get(SERVER_INSTANCE_METADATA)
            with contextlib.suppress(grpc.RpcError):  # a refusal carries the id as well
                await call
        refused = pb.SubmitMemberRequest(member=member(0, group=" "), prompt=PROMPT)
        stream = stub.StreamGroups(iter([pb.StreamGroupsRequest(member=refused)]), timeout=10)
        metadata = await stream.initial_metadata()
        seen["StreamGroups"] = dict(metadata).get(SERVER_INSTANCE_METADATA)
        async for _ in stream:
            pass
    return seen


async def test_every_cohort_rpc_sends_the_server_instance_id_first_and_a_new_process_mints_another(
    start_server: StartServer,
) -> None:
    first, _ = await start_server()
    second, _ = await start_server(store="memory://")  # one store file serves one server
    seen = await _instances(first.port)
    assert set(seen) == {"SubmitMember", "Compare", "GetCohort", "StreamGroups"}
    assert set(seen.values()) == {first.servicer.instance_id}
    assert len(first.servicer.instance_id) == 16
    assert set((await _instances(second.port)).values()) == {second.servicer.instance_id}
    assert first.servicer.instance_id != second.servicer.instance_id
