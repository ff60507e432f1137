"""Compare, health and reflection over real gRPC against the fake judge over real HTTP."""

from __future__ import annotations

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from genrm_grpc.config import Settings
from genrm_grpc.scoring import aggregate
from genrm_grpc.scoring.types import AnswerTexts, JudgedPair, Verdict
from genrm_grpc.testing import FakeJudgeServer

from .conftest import ANSWERS, CALL_ERRORS, PROMPT, StartServer, call_error

CANDIDATES = [pb.Candidate(output_text=a) for a in ANSWERS]


def _local_rewards(reply: pb.CompareResponse) -> list[float]:
    judged = [
        JudgedPair(
            c.response_i,
            c.response_j,
            c.judge_index,
            Verdict(c.score_1, c.score_2, c.ranking, c.parse_failed),
        )
        for c in reply.comparisons
    ]
    texts = [AnswerTexts("", a) for a in ANSWERS]
    return [m.reward for m in aggregate(texts, judged, Settings()).members]


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_compare_rewards_every_candidate_from_the_judges_verdicts(
    start_server: StartServer, fake_judge: FakeJudgeServer, api: str
) -> None:
    _, client = await start_server(judge={"api": api})
    reply = await client.compare(PROMPT, CANDIDATES, timeout=30)
    assert len(reply.rewards) == 4
    assert len(reply.comparisons) == 4  # circular: (0,1) (1,2) (2,3) (3,0)
    assert list(reply.rewards) == pytest.approx(_local_rewards(reply), abs=1e-12)
    assert reply.rewards[3] == min(reply.rewards)  # the empty answer is judged as "None"
    stats = fake_judge.stats()
    assert stats["by_endpoint"] == {api: 4}
    assert "mean_individual_score" in reply.metrics
    assert reply.metrics["judge_output_tokens_total"] > 0


async def test_compare_retries_overloaded_judge_and_still_judges_each_pair_once(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_503_first_n=1)
    _, client = await start_server()
    reply = await client.compare(PROMPT, CANDIDATES, timeout=30)
    stats = fake_judge.stats()
    assert stats["by_outcome"]["fail_503"] == 4
    assert stats["by_outcome"]["ok"] == 4
    assert sorted(stats["pairs"].values()) == [2, 2, 2, 2]
    assert len(reply.rewards) == 4


async def test_compare_honours_retry_after_from_a_rate_limited_judge(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_429_first_n=1, retry_after_s=0)
    _, client = await start_server()
    reply = await client.compare(PROMPT, CANDIDATES[:2], timeout=30)
    assert fake_judge.stats()["by_outcome"]["fail_429"] == 2
    assert len(reply.rewards) == 2


async def test_compare_judge_failure_is_unavailable_with_judge_failed_reason(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_400_rate=1.0)
    _, client = await start_server()
    with pytest.raises(CALL_ERRORS) as caught:
        await client.compare(PROMPT, CANDIDATES, timeout=30)
    info = call_error(caught.value)
    assert info.code == grpc.StatusCode.UNAVAILABLE
    assert info.reason == "JUDGE_FAILED"
    assert info.domain == "cohort.genrm.v1"
    assert "400" in info.message


async def test_compare_output_budget_exhaustion_names_max_output_tokens(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(budget_exhaust_rate=1.0)
    _, client = await start_server(judge={"max_output_tokens": 256}, genrm_parse_retries=1)
    with pytest.raises(CALL_ERRORS) as caught:
        await client.compare(PROMPT, CANDIDATES[:2], timeout=30)
    info = call_error(caught.value)
    assert info.reason == "JUDGE_FAILED"
    assert "max_output_tokens=256" in info.message
    assert "2 of 2" in info.message


async def test_compare_unparseable_answers_fall_back_to_default_verdicts(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(malformed_rate=1.0)
    _, client = await start_server(genrm_parse_retries=2)
    reply = await client.compare(PROMPT, CANDIDATES[:2], timeout=30)
    assert all(c.parse_failed for c in reply.comparisons)
    assert reply.metrics["genrm_parse_failure_rate_per_group"] == 1.0
    assert fake_judge.stats()["total"] == 2 * 3  # two pairs, three attempts each
    # Default verdict (3, 3, 3.5): a tie with no tie-break, so both get 3.0.
    assert list(reply.rewards) == [3.0, 3.0]


async def test_compare_refuses_a_candidate_with_both_forms(start_server: StartServer) -> None:
    _, client = await start_server()
    bad = pb.Candidate(output_text="x", responses_api_json='{"output": []}')
    with pytest.raises(CALL_ERRORS) as caught:
        await client.compare(PROMPT, [CANDIDATES[0], bad], timeout=10)
    info = call_error(caught.value)
    assert info.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == "INVALID_MEMBER"
    assert info.field_violations[0][0] == "candidates[1]"


async def test_health_serves_overall_and_service_then_not_serving_while_draining(
    start_server: StartServer,
) -> None:
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "genrm.cohort.v1.CohortService"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await server.health.enter_graceful_shutdown()
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_reflection_lists_the_cohort_service_like_grpcurl_list(
    start_server: StartServer,
) -> None:
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask() -> reflection_pb2.ServerReflectionRequest:
            yield reflection_pb2.ServerReflectionRequest(list_services="")
            yield reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="genrm.cohort.v1.CohortService"
            )
            yield reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="genrm.cohort.v1.CohortService.SubmitMember"
            )

        replies = [r async for r in stub.ServerReflectionInfo(ask())]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"genrm.cohort.v1.CohortService", "grpc.health.v1.Health"} <= names
    files = {
        f.name: f
        for f in map(
            descriptor_pb2.FileDescriptorProto.FromString,
            replies[1].file_descriptor_response.file_descriptor_proto,
        )
    }
    assert {"genrm/cohort/v1/cohort.proto", "google/rpc/status.proto"} <= set(files)
    # The proto comments (the operators' API reference) travel with the descriptor.
    comments = [
        loc.leading_comments
        for loc in files["genrm/cohort/v1/cohort.proto"].source_code_info.location
    ]
    assert any("SubmitMember adds one member to its cohort" in c for c in comments)
    # A method name resolves to its service's file (grpcurl describe Service.Method).
    assert replies[2].file_descriptor_response.file_descriptor_proto


async def test_compare_lists_verdicts_in_aggregation_order(start_server: StartServer) -> None:
    _, client = await start_server(num_judges_per_comparison=2, comparison_strategy="all_pairs")
    reply = await client.compare(PROMPT, CANDIDATES[:3], timeout=30)
    order = [(c.judge_index, c.response_i, c.response_j) for c in reply.comparisons]
    assert order == [(k, i, j) for k in (0, 1) for i, j in ((0, 1), (0, 2), (1, 2))]


async def test_fixed_baseline_judges_members_against_the_baseline_on_alternating_sides(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    from genrm_grpc.testing import fake_verdict, pair_key

    baseline = "Unit testing means testing small units of code."
    prompt = pb.Prompt(messages=PROMPT.messages, baseline_response=baseline)
    _, client = await start_server(comparison_mode="fixed_baseline")
    reply = await client.compare(prompt, CANDIDATES, timeout=30)
    assert [(c.response_i, c.response_j) for c in reply.comparisons] == [(m, 4) for m in range(4)]
    sent = set(fake_judge.stats()["pairs"])
    question = PROMPT.messages[-1].content
    expected = []
    for m, answer in enumerate(ANSWERS):
        judged = answer or "None"
        if m % 2 == 0:  # member on side 1
            assert pair_key(judged, baseline) in sent
            s1, s2, r = fake_verdict(question, judged, baseline)
        else:  # member on side 2: the verdict is mapped back to the member's side
            assert pair_key(baseline, judged) in sent
            s2, s1, r7 = fake_verdict(question, baseline, judged)
            r = 7 - r7
        expected.append(s1 + (3.5 - r) if s1 == s2 else float(s1))
    assert list(reply.rewards) == expected


async def test_fixed_baseline_mode_requires_a_baseline(start_server: StartServer) -> None:
    _, client = await start_server(comparison_mode="fixed_baseline")
    with pytest.raises(CALL_ERRORS) as caught:
        await client.compare(PROMPT, CANDIDATES, timeout=10)
    info = call_error(caught.value)
    assert info.reason == "INVALID_MEMBER"
    assert info.field_violations[0][0] == "prompt.baseline_response"
