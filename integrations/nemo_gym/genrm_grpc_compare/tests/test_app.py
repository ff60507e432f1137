"""The resources server under the real nemo-gym package, over real HTTP and real gRPC."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError
from nemo_gym.base_resources_server import BaseVerifyResponse

from genrm_grpc.demo import _process
from genrm_grpc_compare.app import GenRMGrpcVerifyResponse

from .conftest import GROUP_SIZE, Stack

QUESTION = "Name a prime number and say why it is prime."
ANSWERS = [
    "Seven is a prime number because its only divisors are one and seven.",
    "Four.",
    "Two is prime: it is divisible only by one and itself.",
    "",
]


def gym_response(answer: str, index: int) -> dict[str, Any]:
    """A Responses-API object as a Gym policy model returns it."""
    return {
        "id": f"resp-{index}-{uuid.uuid4().hex[:8]}",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": [
            {
                "id": f"msg-{index}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def rollout(
    group: str, index: int, *, attempt: int = 0, answer: str | None = None
) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": QUESTION}]},
        "response": gym_response(ANSWERS[index] if answer is None else answer, index),
        "_ng_group_id": group,
        "_ng_group_attempt": attempt,
        "_ng_rollout_index": index,
        "_ng_task_index": 7,
    }


def new_group() -> str:
    return f"gym-test/{uuid.uuid4()}"


async def until_present(stack: Stack, group: str, attempt: int, index: int) -> None:
    """Wait until genrm-grpc holds the member (its cohort lists the slot)."""
    async with CohortClient(stack.target) as client, asyncio.timeout(30):
        while True:
            try:
                info = await client.get_cohort(group, attempt=attempt, timeout=5)
                if index in info.present_indices:
                    return
            except CohortError as exc:
                if exc.reason != "COHORT_NOT_FOUND":
                    raise
            await asyncio.sleep(0.02)


async def test_four_concurrent_verifies_return_the_rewards_of_a_direct_submit_member_run(
    stack: Stack,
) -> None:
    group = new_group()
    payloads = [rollout(group, i) for i in range(GROUP_SIZE)]
    before = stack.judge_stats()["total"]
    replies = await asyncio.gather(*(stack.verify(p) for p in payloads))
    assert [status for status, _ in replies] == [200] * GROUP_SIZE
    assert stack.judge_stats()["total"] - before == GROUP_SIZE  # circular: N comparisons

    direct_group = new_group()
    prompt = pb.Prompt(messages=[pb.ChatMessage(role="user", content=QUESTION)])
    async with CohortClient(stack.target) as client:
        direct = await asyncio.gather(
            *(
                client.submit_member(
                    pb.MemberRef(
                        group_id=direct_group,
                        group_attempt=0,
                        rollout_index=i,
                        group_size=GROUP_SIZE,
                    ),
                    prompt,
                    pb.Candidate(responses_api_json=json.dumps(p["response"])),
                    timeout=60,
                )
                for i, p in enumerate(payloads)
            )
        )
    rewards = [body["reward"] for _, body in replies]
    assert rewards == [r.reward for r in direct]
    assert len(set(rewards)) > 1  # the judge told the answers apart
    for i, (_, body) in enumerate(replies):
        BaseVerifyResponse.model_validate(body)
        assert body["_ng_group_id"] == group and body["_ng_group_attempt"] == 0
        assert body["_ng_rollout_index"] == i and body["_ng_task_index"] == 7
        assert body["mask_sample"] is False and body["genrm_replayed"] is False
        assert "_ng_failure_class" not in body and "failure_reason" not in body
        assert body["response"]["id"] == payloads[i]["response"]["id"]
        assert body["reward_overall_score"] == body["reward"]


async def test_retried_identical_verify_replays_without_judging_again(stack: Stack) -> None:
    group = new_group()
    payloads = [rollout(group, i) for i in range(GROUP_SIZE)]
    first = await asyncio.gather(*(stack.verify(p) for p in payloads))
    calls = stack.judge_stats()["total"]
    status, body = await stack.verify(payloads[2])
    assert status == 200
    assert body["genrm_replayed"] is True
    assert body["reward"] == first[2][1]["reward"]
    assert stack.judge_stats()["total"] == calls


async def test_different_answer_for_a_filled_slot_gets_409(stack: Stack) -> None:
    group = new_group()
    await asyncio.gather(*(stack.verify(rollout(group, i)) for i in range(GROUP_SIZE)))
    status, body = await stack.verify(rollout(group, 1, answer="Nine is prime."))
    assert status == 409
    assert body["detail"] == "GenRM already has a different response for rollout_index=1"


async def test_superseded_attempt_gets_gyms_statuses(stack: Stack) -> None:
    group = new_group()
    # An attempt-0 member waits for its group; attempt 1 supersedes it: Gym says 503.
    waiting = asyncio.create_task(stack.verify(rollout(group, 0, attempt=0)))
    await until_present(stack, group, 0, 0)
    newer = await asyncio.gather(
        *(stack.verify(rollout(group, i, attempt=1)) for i in range(GROUP_SIZE))
    )
    assert [status for status, _ in newer] == [200] * GROUP_SIZE
    status, body = await waiting
    assert status == 503
    assert "superseded" in body["detail"]
    # A member of the superseded attempt arriving now: Gym says 409.
    status, body = await stack.verify(rollout(group, 2, attempt=0))
    assert status == 409
    assert body["detail"] == "GenRM attempt 0 was superseded by attempt 1"


async def test_prompt_mismatch_gets_409(stack: Stack) -> None:
    group = new_group()
    waiting = asyncio.create_task(stack.verify(rollout(group, 0)))
    await until_present(stack, group, 0, 0)
    other = rollout(group, 1)
    other["responses_create_params"]["input"][0]["content"] = "A different question?"
    status, body = await stack.verify(other)
    assert status == 409
    assert body["detail"].startswith("GenRM group received inconsistent prompt")
    rest = await asyncio.gather(*(stack.verify(rollout(group, i)) for i in (1, 2, 3)))
    assert [s for s, _ in rest] == [200, 200, 200]
    assert (await waiting)[0] == 200


async def test_judge_outage_returns_masked_200(stack: Stack) -> None:
    stack.judge_faults(fail_503_rate=1.0, retry_after_s=None)
    group = new_group()
    replies = await asyncio.gather(*(stack.verify(rollout(group, i)) for i in range(GROUP_SIZE)))
    for i, (status, body) in enumerate(replies):
        assert status == 200
        assert body["reward"] == 0.0
        assert body["mask_sample"] is True
        assert body["failure_kind"] == "judge_failed"
        assert 0 < len(body["failure_reason"]) <= 2000
        assert body["instance_config"]["mask_sample"] is True
        assert body["_ng_failure_class"] == "judge_failed"
        assert body["_ng_failure_judge_error"] == body["failure_reason"]
        assert body["_ng_rollout_index"] == i
        assert GenRMGrpcVerifyResponse.model_validate(body).mask_sample is True


@pytest.mark.parametrize(
    ("then", "masked"),
    [("fail_503_rate", True), ("budget_exhaust_rate", False), ("empty_rate", False)],
)
async def test_an_unparseable_answer_then_503s_is_masked_like_gym_but_then_empty_is_default(
    stack: Stack, then: str, masked: bool
) -> None:
    # Gym's cohort-lifecycle rule: every pass's first answer is unparseable; when its
    # remaining attempts get HTTP 503 the group is masked, when they get an exhausted
    # output budget or an empty answer every pass takes the default verdict (unmasked).
    stack.judge_reset_stats()  # restart every pair's first-n count
    stack.judge_faults(malformed_first_n=1, **{then: 1.0})
    try:
        group = new_group()
        replies = await asyncio.gather(
            *(stack.verify(rollout(group, i)) for i in range(GROUP_SIZE))
        )
    finally:
        stack.judge_faults(malformed_first_n=0, **{then: 0.0})
    assert [status for status, _ in replies] == [200] * GROUP_SIZE
    for _, body in replies:
        assert body["mask_sample"] is masked
        assert (body.get("_ng_failure_class") == "judge_failed") is masked
    if not masked:
        assert len({body["reward"] for _, body in replies}) == 1  # default verdicts only


async def test_missing_rollout_index_gets_422(stack: Stack) -> None:
    payload = rollout(new_group(), 0)
    del payload["_ng_rollout_index"]
    status, body = await stack.verify(payload)
    assert status == 422
    assert body["detail"] == "_ng_rollout_index is required"


async def test_compare_forwards_to_compare(stack: Stack) -> None:
    reply = await stack.http.post(
        "/compare",
        json={
            "conversation_history": [{"role": "user", "content": QUESTION}],
            "response_objs": [gym_response(a, i) for i, a in enumerate(ANSWERS[:3])],
        },
    )
    assert reply.status_code == 200
    body = reply.json()
    assert len(body["rewards"]) == 3
    assert {(c["response_i"], c["response_j"]) for c in body["comparison_results"]} == {
        (0, 1),
        (1, 2),
        (2, 0),
    }


async def test_genrm_grpc_shutdown_fails_the_waiting_rollout_with_503(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server of its own (its own store file), stopped with SIGTERM while a rollout of
    # its group waits: the cohort is kept for a restart, the waiting call is told so.
    monkeypatch.setenv("GENRM_STORE", f"sqlite:///{tmp_path}/own.sqlite3")
    args = [sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", "127.0.0.1:0"]
    args += ["--judge-url", stack.judge_url, "--shutdown-grace-s", "0.5", "--log-level", "ERROR"]
    with _process(args, "genrm-grpc serving on") as (proc, target):
        stack.server.config.grpc_target = target
        stack.server.config.unavailable_retries = 1
        await stack.server.aclose()  # the next call opens a channel to this server
        group = new_group()
        waiting = asyncio.create_task(stack.verify(rollout(group, 0)))
        await until_present(Stack(stack.judge_url, target, stack.http, stack.server), group, 0, 0)
        proc.send_signal(signal.SIGTERM)
        status, body = await waiting
        assert proc.wait(timeout=30) == 0
    assert status == 503
    assert "shut" in body["detail"].lower()
    # genrm-grpc is gone: the transport failure is a 503 too, after the configured calls.
    status, body = await stack.verify(rollout(new_group(), 1))
    assert status == 503
    assert body["detail"].startswith("genrm-grpc: UNAVAILABLE")


async def test_principle_reaches_the_judge_and_legacy_task_groups_work(stack: Stack) -> None:
    task = 1000 + uuid.uuid4().int % 1_000_000
    payloads = []
    for i in range(GROUP_SIZE):
        payload = rollout("unused", i)
        del payload["_ng_group_id"], payload["_ng_group_attempt"]
        payload["_ng_task_index"] = task  # a legacy group: task index + prompt
        payload["principle"] = "Prefer the shortest correct answer."
        payloads.append(payload)
    replies = await asyncio.gather(*(stack.verify(p) for p in payloads))
    assert [status for status, _ in replies] == [200] * GROUP_SIZE
    assert all(
        body["_ng_task_index"] == task and body["mask_sample"] is False for _, body in replies
    )
    last = json.dumps(stack.judge_stats()["last_request"])
    assert "Prefer the shortest correct answer." in last
