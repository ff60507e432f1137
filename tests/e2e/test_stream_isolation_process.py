"""One member never ends a StreamGroups stream: against a real server process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb

# On each kind of store (tests/store_kinds.py): the server process inherits GENRM_STORE.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("store_of_kind")]

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Say something.")])
GARBAGE = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, absurd length
#: Around the interpreter's recursion limit, where some step of a member's handling runs
#: out of stack; far beyond it the JSON parser refuses it itself.
DEPTHS = [*range(940, 1001), 5000]


def _request(group: str, candidate: pb.Candidate) -> bytes:
    return pb.StreamGroupsRequest(
        member=pb.SubmitMemberRequest(
            member=pb.MemberRef(group_id=group, group_attempt=0, rollout_index=0, group_size=1),
            prompt=PROMPT,
            candidate=candidate,
        )
    ).SerializeToString()


def _nested(depth: int) -> str:
    head = json.dumps({"output": [{"type": "message", "content": []}]})[:-1]
    return head + ',"x":' + "[" * depth + "]" * depth + "}"


@pytest.fixture
def target() -> Iterator[str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "genrm_grpc.cli", "serve"),
            *("--listen", "127.0.0.1:0", "--judge-url", "http://127.0.0.1:9"),
            *("--log-level", "ERROR"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("genrm-grpc serving on"), line
        yield line.rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _stream(target: str) -> tuple[list[pb.StreamGroupsResponse], grpc.StatusCode]:
    requests = [GARBAGE]
    requests += [_request(f"deep-{d}", pb.Candidate(responses_api_json=_nested(d))) for d in DEPTHS]
    requests.append(_request("after", pb.Candidate(output_text="still served")))
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream(
            "/genrm.cohort.v1.CohortService/StreamGroups",
            response_deserializer=pb.StreamGroupsResponse.FromString,
        )(iter(requests), timeout=60)
        events = [event async for event in call]
        return events, await call.code()


def test_malformed_and_deeply_nested_members_are_member_errors_and_the_stream_goes_on(
    target: str,
) -> None:
    events, code = asyncio.run(_stream(target))
    assert code == grpc.StatusCode.OK
    outcomes = [e for e in events if e.WhichOneof("event") in ("result", "error")]
    assert len(outcomes) == 1 + len(DEPTHS) + 1  # one outcome per request, none lost
    assert outcomes[0].WhichOneof("event") == "error"
    assert outcomes[0].error.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    for event in outcomes[1:-1]:
        if event.WhichOneof("event") == "error":
            assert event.error.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert outcomes[-1].WhichOneof("event") == "result"
    assert outcomes[-1].result.member.group_id == "after"
