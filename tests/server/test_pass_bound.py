"""max_judge_passes_per_cohort: a tiny member cannot make the server plan a huge group."""

from __future__ import annotations

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import error_info

from genrm_grpc.config import ConfigError, load_settings
from genrm_grpc.testing import FakeJudgeServer

from .conftest import PROMPT, StartServer, member


async def test_a_member_declaring_more_judge_passes_than_allowed_is_invalid_at_once(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server, client = await start_server(comparison_strategy="all_pairs")
    tiny = pb.SubmitMemberRequest(
        member=member(0, size=4096), prompt=PROMPT, candidate=pb.Candidate(output_text="x")
    )
    assert tiny.ByteSize() < 100
    with pytest.raises(grpc.RpcError) as caught:
        await client.stub.SubmitMember(tiny, timeout=5)
    err = error_info(caught.value)
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMBER")
    assert err.field_violations[0][0] == "member.group_size"
    assert "8386560 judge passes" in err.field_violations[0][1]
    assert "max_judge_passes_per_cohort=16384" in err.field_violations[0][1]
    assert err.metadata["groupId"] == "g1"
    # Refused before it became a cohort; the same size under circular (4096 passes) is fine.
    assert server.runtime.stats()["active_cohorts"] == 0
    fits = pb.SubmitMemberRequest(
        member=member(0, size=182), prompt=PROMPT, candidate=pb.Candidate(output_text="x")
    )
    with pytest.raises(grpc.RpcError) as too_many:
        await client.stub.SubmitMember(fits, timeout=5)
    assert error_info(too_many.value).code == grpc.StatusCode.INVALID_ARGUMENT  # 16,471 passes
    fits.member.group_size = 181  # 16,290 passes: accepted, waits for its group
    with pytest.raises(grpc.RpcError) as waiting:
        await client.stub.SubmitMember(fits, timeout=0.5)
    assert error_info(waiting.value).code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert fake_judge.stats()["total"] == 0


def test_a_default_group_size_beyond_the_pass_bound_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="max_judge_passes_per_cohort"):
        load_settings(
            num_rollouts_per_prompt=64, num_judges_per_comparison=9, comparison_strategy="all_pairs"
        )
    load_settings(num_rollouts_per_prompt=64, num_judges_per_comparison=9)  # circular: 576
