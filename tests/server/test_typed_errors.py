"""Typed errors on every path: deep JSON nesting, over-long ids, trailers that always fit.

Real gRPC over loopback with the client's default metadata limit: an error whose
trailers exceeded it would reach the client without its ErrorInfo.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import ErrorDetails, error_info

from genrm_grpc.cohort.identity import MAX_ID_LENGTH, MAX_JSON_DEPTH
from genrm_grpc.testing import FakeJudgeServer

from .conftest import PROMPT, StartServer, candidate, member


@pytest.fixture
async def stub(start_server: StartServer) -> AsyncIterator[pb_grpc.CohortServiceStub]:
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.CohortServiceStub(channel)


async def _error(call: object) -> ErrorDetails:
    with pytest.raises(grpc.RpcError) as caught:
        await call  # type: ignore[misc]
    return error_info(caught.value)


def _nested(depth: int) -> str:
    return '{"output": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 960, 975, 985, 990, 5000])
async def test_deeply_nested_responses_json_is_invalid_member_on_submit_and_compare(
    stub: pb_grpc.CohortServiceStub, fake_judge: FakeJudgeServer, depth: int
) -> None:
    nested = pb.Candidate(responses_api_json=_nested(depth))
    submitted = await _error(
        stub.SubmitMember(
            pb.SubmitMemberRequest(member=member(0), prompt=PROMPT, candidate=nested), timeout=5
        )
    )
    compared = await _error(
        stub.Compare(pb.CompareRequest(prompt=PROMPT, candidates=[nested, candidate(1)]), timeout=5)
    )
    for err, where in ((submitted, "candidate"), (compared, "candidates[0]")):
        assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMBER")
        assert err.field_violations[0][0] == f"{where}.responses_api_json"
        assert "nested" in err.field_violations[0][1]
    assert fake_judge.stats()["total"] == 0


async def test_nesting_at_the_bound_is_accepted(stub: pb_grpc.CohortServiceStub) -> None:
    ok = pb.Candidate(responses_api_json=_nested(MAX_JSON_DEPTH))
    response = await stub.Compare(
        pb.CompareRequest(prompt=PROMPT, candidates=[ok, candidate(1)]), timeout=10
    )
    assert len(response.rewards) == 2


@pytest.mark.parametrize(
    "ref",
    [
        pb.MemberRef(group_id="g" * 20_000),
        pb.MemberRef(group_id="😀" * 5_000, group_attempt=3),
        pb.MemberRef(prompt_id="p" * 20_000),
        pb.MemberRef(group_id=" "),
    ],
    ids=["long-ascii-group-id", "long-emoji-group-id", "long-prompt-id", "blank-group-id"],
)
async def test_get_cohort_bounds_ids_with_a_typed_error(
    stub: pb_grpc.CohortServiceStub, ref: pb.MemberRef
) -> None:
    err = await _error(stub.GetCohort(pb.GetCohortRequest(member=ref, prompt=PROMPT), timeout=5))
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMBER")
    assert err.field_violations and err.field_violations[0][0].startswith("member.")
    assert all(len(v.encode()) <= 512 for v in err.metadata.values())


async def test_errors_echoing_the_longest_valid_ids_keep_their_error_info(
    stub: pb_grpc.CohortServiceStub,
) -> None:
    """A 512-character id of 4-byte characters is valid; echoed whole it would not fit."""
    gid = "😀" * MAX_ID_LENGTH
    missing = await _error(
        stub.GetCohort(pb.GetCohortRequest(member=pb.MemberRef(group_id=gid)), timeout=5)
    )
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "COHORT_NOT_FOUND")
    assert missing.metadata["groupId"].endswith("…")
    assert len(missing.metadata["groupId"].encode()) <= 512
    legacy = await _error(
        stub.GetCohort(
            pb.GetCohortRequest(member=pb.MemberRef(prompt_id="😀" * MAX_ID_LENGTH), prompt=PROMPT),
            timeout=5,
        )
    )
    assert legacy.reason == "COHORT_NOT_FOUND"
    assert len(legacy.message.encode()) <= 1024

    request = pb.SubmitMemberRequest(
        member=member(0, group=gid), prompt=PROMPT, candidate=candidate(0)
    )
    call = stub.SubmitMember(request, timeout=0.5)
    with pytest.raises(grpc.RpcError):
        await call  # accepted; waits for its group
    request.candidate.output_text = "a different answer"
    conflict = await _error(stub.SubmitMember(request, timeout=5))
    assert (conflict.code, conflict.reason) == (grpc.StatusCode.ALREADY_EXISTS, "SLOT_CONFLICT")
    assert len(conflict.message.encode()) <= 1024
    assert conflict.metadata["rolloutIndex"] == "0"
