"""Principals against real server and fake-judge processes: collectors never meet."""

from __future__ import annotations

import asyncio
import pathlib

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.demo import running_stack

# On each kind of store (tests/store_kinds.py): the server process inherits GENRM_STORE.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("store_of_kind")]

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
ALICE = (("authorization", "Bearer alice-e2e-token"),)
BOB = (("authorization", "Bearer bob-e2e-token"),)


def _member(k: int, answer: str, attempt: int = 0) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(group_id="shared-id", group_attempt=attempt, rollout_index=k),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=answer),
    )


async def _two_collectors(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        cohorts = pb_grpc.CohortServiceStub(channel)
        # Bob tries every attack on the group id Alice uses: the highest attempt (a fence),
        # and answers planted in its slots.
        fence = cohorts.StreamGroups(metadata=BOB, timeout=60)
        await fence.write(pb.StreamGroupsRequest(member=_member(0, "Nine.", attempt=2**32 - 1)))
        assert (await fence.read()).WhichOneof("event") == "accepted"
        answers = ["Seven is prime.", "Four.", "Two.", ""]
        results = await asyncio.gather(
            *(
                cohorts.SubmitMember(_member(k, a), metadata=ALICE, timeout=60)
                for k, a in enumerate(answers)
            )
        )
        assert [r.result.member.rollout_index for r in results] == [0, 1, 2, 3]
        assert not any(r.result.mask_sample or r.result.replayed for r in results)
        request = pb.GetCohortRequest(member=pb.MemberRef(group_id="shared-id", group_attempt=0))
        mine = await cohorts.GetCohort(request, metadata=ALICE, timeout=10)
        assert mine.cohort.phase == pb.COHORT_PHASE_COMPLETED
        assert mine.cohort.latest_attempt == 0  # Bob's fence is not Alice's watermark
        with pytest.raises(grpc.RpcError) as caught:
            await cohorts.GetCohort(request, metadata=BOB, timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        fence.cancel()


def test_two_principals_on_the_same_group_ids_never_meet_across_processes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:alice-e2e-token\nbob:bob-e2e-token\n")
    monkeypatch.setenv("GENRM_AUTH__TOKENS_FILE", str(tokens))
    with running_stack() as (_url, target):
        asyncio.run(_two_collectors(target))
