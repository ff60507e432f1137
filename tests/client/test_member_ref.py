"""A MemberRef may be given as a plain mapping (proto or JSON field names)."""

from __future__ import annotations

import asyncio

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, SyncCohortClient, make_member_ref

from genrm_grpc.judge.fake import FakeJudgeServer
from tests.client.support import cohort_server


async def test_submit_member_and_get_cohort_accept_plain_mappings(
    fake_judge: FakeJudgeServer,
) -> None:
    member = {"group_id": "dict-1", "group_attempt": 0, "rollout_index": 0, "group_size": 1}
    async with (
        cohort_server(fake_judge.url) as port,
        CohortClient(f"127.0.0.1:{port}") as client,
    ):
        result = await client.submit_member(member, "ping", "pong")
        info = await client.get_cohort({"groupId": "dict-1", "groupAttempt": 0})
    assert result.member.group_id == "dict-1" and result.reward == 3.0
    assert info.phase == pb.COHORT_PHASE_COMPLETED and list(info.present_indices) == [0]


async def test_sync_client_accepts_a_mapping_too(fake_judge: FakeJudgeServer) -> None:
    member = {"group_id": "dict-2", "rollout_index": 0, "group_size": 1}
    async with cohort_server(fake_judge.url) as port:
        with SyncCohortClient(f"127.0.0.1:{port}") as client:
            # Blocking calls run off this test's event loop, which serves the server.
            result = await asyncio.to_thread(client.submit_member, member, "ping", "pong")
    assert result.member.group_id == "dict-2" and not result.mask_sample


def test_a_mapping_becomes_the_same_member_ref_as_keyword_arguments() -> None:
    built = make_member_ref({"group_id": "g", "group_attempt": 1, "rollout_index": 2})
    assert built == pb.MemberRef(group_id="g", group_attempt=1, rollout_index=2)
    assert built.HasField("group_attempt") and not built.HasField("group_size")
    ref = pb.MemberRef(group_id="g")
    assert make_member_ref(ref) is ref


@pytest.mark.parametrize(
    ("member", "message"),
    [
        ({"group": "g"}, 'has no field named "group"'),
        ({"rollout_index": "two"}, "Failed to parse rollout_index field"),
        ({"rollout_index": -1}, "Failed to parse rollout_index field"),
    ],
)
def test_a_bad_mapping_is_a_value_error_naming_the_field(
    member: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match="invalid member: ") as caught:
        make_member_ref(member)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="MemberRef or a mapping"):
        make_member_ref(["g", 0])  # type: ignore[arg-type]
