"""Message size limits, per-field bounds, the stream bound and the keepalive policy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from google.rpc import error_details_pb2

from genrm_grpc.config import ConfigError, load_settings
from genrm_grpc.runtime.live import Census
from genrm_grpc.server.app import server_options
from genrm_grpc.testing import FakeJudgeServer

from .conftest import CANDIDATES, PROMPT, StartServer, details, rpc_code, stub

BOUNDS: dict[str, Any] = {
    "max_text_chars": 100,
    "max_prompt_messages": 3,
    "max_group_size": 16,
    "max_compare_candidates": 4,
}
LONG = "x" * 101


def _member(**changes: Any) -> pb.SubmitMemberRequest:
    request = pb.SubmitMemberRequest(
        member=pb.MemberRef(group_id="g", group_attempt=0, rollout_index=1, group_size=4),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text="ok"),
    )
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        target: Any = request
        for name in parents:
            target = getattr(target, name)
        if isinstance(value, pb.Prompt):
            getattr(target, leaf).CopyFrom(value)
        else:
            setattr(target, leaf, value)
    return request


def _prompt(*messages: tuple[str, str], **fields: str) -> pb.Prompt:
    return pb.Prompt(messages=[pb.ChatMessage(role=r, content=c) for r, c in messages], **fields)


MEMBER_CASES = [
    (_member(**{"candidate.output_text": LONG}), "candidate.output_text"),
    (_member(**{"candidate.reasoning_text": LONG}), "candidate.reasoning_text"),
    (
        pb.SubmitMemberRequest(
            member=pb.MemberRef(rollout_index=0, group_size=4),
            prompt=PROMPT,
            candidate=pb.Candidate(responses_api_json='{"output": "' + LONG + '"}'),
        ),
        "candidate.responses_api_json",
    ),
    (_member(prompt=_prompt(("user", "hi"), ("assistant", LONG))), "prompt.messages[1].content"),
    (_member(prompt=_prompt(("u" * 65, "hi"))), "prompt.messages[0].role"),
    (_member(prompt=_prompt(("user", "hi"), principle=LONG)), "prompt.principle"),
    (_member(prompt=_prompt(*[("user", "hi")] * 4)), "prompt.messages"),
    (_member(**{"member.group_size": 17}), "member.group_size"),
]


@pytest.mark.parametrize(("request_", "field"), MEMBER_CASES)
async def test_per_field_bounds_are_invalid_argument_naming_the_field(
    start_server: StartServer, request_: pb.SubmitMemberRequest, field: str
) -> None:
    server = await start_server(**BOUNDS)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            await stub(channel).SubmitMember(request_, timeout=10)
        got = details(caught.value)
        assert got.code == grpc.StatusCode.INVALID_ARGUMENT
        assert got.info is not None and got.info.reason == "INVALID_MEMBER"
        assert list(got.violations) == [field]
        assert got.info.metadata["rolloutIndex"] == str(request_.member.rollout_index)
        # The same refusal arrives as a MemberError on a stream, which stays open.
        call = stub(channel).StreamGroups(
            iter([pb.StreamGroupsRequest(member=request_)]), timeout=10
        )
        events = [event async for event in call]
    assert [e.WhichOneof("event") for e in events] == ["error"]
    assert events[0].error.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert await server.runtime.refresh_census() == Census()


async def test_members_within_the_bounds_are_accepted(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server = await start_server(**BOUNDS)
    prompt = _prompt(*[("user", "y" * 100)] * 3, principle="p" * 100)
    requests = [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(group_id="ok", rollout_index=k, group_size=2),
            prompt=prompt,
            candidate=pb.Candidate(output_text="z" * 100, reasoning_text="r" * 100),
        )
        for k in range(2)
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        replies = await asyncio.gather(
            *(stub(channel).SubmitMember(r, timeout=30) for r in requests)
        )
    assert [r.result.member.rollout_index for r in replies] == [0, 1]
    assert fake_judge.stats()["total"] == 2


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.CompareRequest(prompt=PROMPT, candidates=CANDIDATES * 3), "candidates"),
        (
            pb.CompareRequest(
                prompt=PROMPT, candidates=[*CANDIDATES, pb.Candidate(output_text=LONG)]
            ),
            "candidates[2].output_text",
        ),
        (
            pb.CompareRequest(prompt=_prompt(("user", LONG)), candidates=CANDIDATES),
            "prompt.messages[0].content",
        ),
    ],
)
async def test_compare_bounds_are_invalid_argument(
    start_server: StartServer, fake_judge: FakeJudgeServer, request_: pb.CompareRequest, field: str
) -> None:
    server = await start_server(**BOUNDS)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            await stub(channel).Compare(request_, timeout=10)
    got = details(caught.value)
    assert (got.code, list(got.violations)) == (grpc.StatusCode.INVALID_ARGUMENT, [field])
    assert got.info is not None and got.info.reason == "INVALID_MEMBER"
    assert fake_judge.stats()["total"] == 0


async def test_oversized_messages_are_resource_exhausted(start_server: StartServer) -> None:
    server = await start_server(max_message_bytes=4096)
    big = pb.Candidate(output_text="w" * 5000)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            await stub(channel).Compare(
                pb.CompareRequest(prompt=PROMPT, candidates=[big, big]), timeout=10
            )
        got = details(caught.value)
        assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert got.info is not None and got.info.reason == "CAPACITY_EXHAUSTED"
        # Above gRPC's own hard limit (2 × max_message_bytes + 1 MiB) the transport refuses
        # the message before it is decoded: still RESOURCE_EXHAUSTED, without ErrorInfo.
        huge = pb.Candidate(output_text="w" * (2 * 4096 + (1 << 20) + 1))
        with pytest.raises(grpc.RpcError) as caught:
            await stub(channel).Compare(
                pb.CompareRequest(prompt=PROMPT, candidates=[huge]), timeout=10
            )
        assert rpc_code(caught.value) == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_concurrent_streams_per_connection_are_bounded(
    start_server: StartServer, fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    """Three members of one group on one connection that allows two streams at a time.

    The third call cannot open its stream while the first two wait for their cohort, so
    the group never completes on that connection: the collection deadline fails it. A
    second connection gets its own streams, which is what lets such a group complete.
    """
    server = await start_server(max_concurrent_streams=2, cohort_collection_timeout_s=1.0)
    roomy = await start_server(  # no deadline pressure; a second server, a second file
        max_concurrent_streams=2,
        store=f"sqlite:///{tmp_path}/roomy.sqlite3",
    )

    def request(group: str, k: int) -> pb.SubmitMemberRequest:
        return pb.SubmitMemberRequest(
            member=pb.MemberRef(group_id=group, rollout_index=k, group_size=3),
            prompt=PROMPT,
            candidate=pb.Candidate(output_text=f"answer {k}"),
        )

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        calls = [stub(channel).SubmitMember(request("one", k), timeout=30) for k in range(3)]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(o, grpc.RpcError) for o in outcomes)
    assert {details(o).info.reason for o in outcomes} == {"COHORT_FAILED"}  # type: ignore[arg-type,union-attr]
    assert fake_judge.stats()["total"] == 0

    # Channels to one target share a connection unless they use their own subchannel pool.
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    target = f"127.0.0.1:{roomy.port}"
    channels = [grpc.aio.insecure_channel(target, options=own_connection) for _ in range(2)]
    calls = [stub(channels[k % 2]).SubmitMember(request("two", k), timeout=30) for k in range(3)]
    replies = await asyncio.gather(*calls)
    for channel in channels:
        await channel.close()
    assert sorted(r.result.member.rollout_index for r in replies) == [0, 1, 2]


def test_keepalive_policy_allows_30_second_client_pings() -> None:
    options = dict(server_options(load_settings(max_concurrent_streams=7)))
    assert options["grpc.keepalive_time_ms"] == 60_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.http2.min_ping_interval_without_data_ms"] <= 30_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_ping_strikes"] == 2
    assert options["grpc.max_concurrent_streams"] == 7


def test_bounds_are_validated_at_start_up() -> None:
    with pytest.raises(ConfigError, match="max_group_size"):
        load_settings(max_group_size=4097)
    with pytest.raises(ConfigError, match="exceeds max_group_size"):
        load_settings(max_group_size=4, num_rollouts_per_prompt=8)
    with pytest.raises(ConfigError, match="max_concurrent_streams"):
        load_settings(max_concurrent_streams=0)


GARBAGE = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, absurd length


async def test_undecodable_bytes_are_invalid_argument_not_unknown(
    start_server: StartServer,
) -> None:
    server = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for method in ("SubmitMember", "Compare", "GetCohort"):
            call = channel.unary_unary(f"/genrm.cohort.v1.CohortService/{method}")
            with pytest.raises(grpc.RpcError) as caught:
                await call(GARBAGE, timeout=10)
            got = details(caught.value)
            assert got.code == grpc.StatusCode.INVALID_ARGUMENT, method
            assert got.info is not None and got.info.reason == "INVALID_MEMBER"
            assert list(got.violations) == ["request"]
    assert await server.runtime.refresh_census() == Census()


async def test_undecodable_bytes_on_a_stream_are_one_member_error_and_the_stream_goes_on(
    start_server: StartServer,
) -> None:
    server = await start_server()
    valid = pb.StreamGroupsRequest(member=_member()).SerializeToString()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = channel.stream_stream(
            "/genrm.cohort.v1.CohortService/StreamGroups",
            response_deserializer=pb.StreamGroupsResponse.FromString,
        )
        call = stream(iter([GARBAGE, valid]), timeout=10)
        first = await call.read()
        second = await call.read()
        call.cancel()
    assert first.WhichOneof("event") == "error"
    status = first.error.status
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.reason == "INVALID_MEMBER"
    # The member after the undecodable one is still read and accepted.
    assert second.WhichOneof("event") == "accepted"
    assert second.accepted.member.rollout_index == 1
