"""The client package's batch scoring helpers: real gRPC to a live server and the fake judge.

(verl's and OpenRLHF's reward paths are tested under the installed frameworks:
integrations/verl/tests and integrations/openrlhf/tests.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from genrm_cohort_client import (
    BatchScores,
    CohortClient,
    MaskedGroupsError,
    score_groups,
    score_samples,
)

from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from tests.client.support import cohort_server, prewarm_pairs

PROMPTS = ["Name a prime number.", "What is the capital of France?"]
ANSWERS = [
    ["Seven is a prime number.", "Four.", "Two is the only even prime number.", "Nine."],
    ["Paris is the capital of France.", "Lyon.", "The capital of France is Paris.", ""],
]


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


async def test_score_groups_returns_input_order_rewards_equal_to_a_direct_stream(
    fake_judge: FakeJudgeServer,
) -> None:
    async with cohort_server(fake_judge.url) as port:
        target = f"127.0.0.1:{port}"
        scores = await asyncio.to_thread(score_groups, target, PROMPTS, ANSWERS)
        async with CohortClient(target) as client:
            direct = [
                [r.reward for r in await client.evaluate_group_all(p, a)]
                for p, a in zip(PROMPTS, ANSWERS, strict=True)
            ]
    assert scores.rewards == direct
    assert scores.mask == [[False] * 4, [False] * 4]
    assert len(set(scores.group_ids)) == 2
    assert scores.rewards[0][1] < scores.rewards[0][0]  # input order kept: "Four." is worst
    assert all(
        r is not None and r.member.rollout_index == k for k, r in enumerate(scores.results[1])
    )


async def test_masked_group_is_reported_and_on_masked_raise_raises(
    fake_judge: FakeJudgeServer,
) -> None:
    fake_judge.set_faults(fail_400_first_n=1)
    prewarm_pairs(fake_judge, ANSWERS[0])  # group 0 meets no fault, group 1 the outage
    async with cohort_server(fake_judge.url) as port:
        target = f"127.0.0.1:{port}"
        scores = await asyncio.to_thread(score_groups, target, PROMPTS, ANSWERS)
        fresh = [[f"{a} Indeed." for a in ANSWERS[1]]]  # pairs the outage has not seen yet
        with pytest.raises(MaskedGroupsError, match="4 of 4 members are masked") as raised:
            await asyncio.to_thread(score_groups, target, PROMPTS[1:], fresh, on_masked="raise")
    assert scores.mask == [[False] * 4, [True] * 4]
    assert scores.failure_kinds[1] == ["judge_failed"] * 4
    assert all(reason for reason in scores.failure_reasons[1])
    assert scores.failure_reasons[0] == [""] * 4
    assert raised.value.scores.masked_count == 4


def test_masked_members_take_their_groups_unmasked_mean() -> None:
    scores = BatchScores(
        group_ids=["a", "b"],
        rewards=[[4.0, 0.0, 2.0], [0.0, 0.0]],
        mask=[[False, True, False], [True, True]],
        failure_kinds=[["", "judge_failed", ""], ["judge_failed"] * 2],
        failure_reasons=[["", "x", ""], ["y", "y"]],
        results=[[None] * 3, [None] * 2],
    )
    assert scores.rewards_with_masked_as_group_mean() == [[4.0, 3.0, 2.0], [0.0, 0.0]]
    assert scores.rewards_with_masked_as_group_mean(all_masked=3.5)[1] == [3.5, 3.5]


async def test_score_samples_groups_a_flat_batch_and_keeps_sample_order(
    fake_judge: FakeJudgeServer,
) -> None:
    # Interleaved, as a framework may hand them over: A0 B0 A1 B1 ...
    prompts = [PROMPTS[j % 2] for j in range(8)]
    answers = [ANSWERS[j % 2][j // 2] for j in range(8)]
    async with cohort_server(fake_judge.url) as port:
        target = f"127.0.0.1:{port}"
        flat = await asyncio.to_thread(score_samples, target, prompts, answers)
        grouped = await asyncio.to_thread(score_groups, target, PROMPTS, ANSWERS)
    assert flat.rewards == [grouped.rewards[j % 2][j // 2] for j in range(8)]
    assert flat.mask == [False] * 8
    assert len(set(flat.group_ids)) == 2 and flat.group_ids[0] == flat.group_ids[2]


def test_mismatched_inputs_are_value_errors() -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 answer lists"):
        score_groups("127.0.0.1:1", PROMPTS, ANSWERS[:1])
    with pytest.raises(ValueError, match="mixes different prompts"):
        score_samples("127.0.0.1:1", ["a", "b"], ["x", "y"], group_keys=[1, 1])
