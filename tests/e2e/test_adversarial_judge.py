"""A judge that answers with parser-hostile text must not stall the server.

The real server and the real fake judge run as processes on loopback. Every judge
answer is an adversarial one (an unclosed fence followed by spaces, a run of ``{``,
``{"`` runs, nested escaped quotes: 128 Ki characters each, none holding a verdict). The
health check must keep answering within its deadline the whole time, and the group must
complete with the default verdict, as NeMo Gym does with an unparseable last answer.
"""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genrm_grpc.demo import running_stack

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
ANSWERS = ["Seven is a prime number.", "Four.", "Two is the only even prime number.", "Nine."]
ADVERSARIAL_CHARS = 128 * 1024
HEALTH_DEADLINE_S = 5.0


async def _group_while_probing_health(
    target: str,
) -> tuple[list[pb.MemberResult], list[int]]:
    done = asyncio.Event()
    statuses: list[int] = []

    async def probe() -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while not done.is_set():
                # DEADLINE_EXCEEDED here (a blocked event loop) fails the test.
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_DEADLINE_S
                )
                statuses.append(reply.status)
                await asyncio.sleep(0.02)

    async def judge_group() -> list[pb.MemberResult]:
        requests = [
            pb.SubmitMemberRequest(
                member=pb.MemberRef(group_id="adversarial", rollout_index=k, group_size=4),
                prompt=PROMPT,
                candidate=pb.Candidate(output_text=answer),
            )
            for k, answer in enumerate(ANSWERS)
        ]
        try:
            async with CohortClient(target) as client:
                events = [e async for e in client.stream_groups(requests, timeout=120)]
        finally:
            done.set()
        return [e.result for e in events if e.WhichOneof("event") == "result"]

    results, _ = await asyncio.gather(judge_group(), probe())
    return results, statuses


def test_health_keeps_answering_while_every_judge_answer_is_adversarial() -> None:
    with running_stack() as (judge_url, target):
        faults = {"adversarial_first_n": 1000, "adversarial_chars": ADVERSARIAL_CHARS}
        httpx.post(f"{judge_url}/faults", json=faults, timeout=10).raise_for_status()
        results, statuses = asyncio.run(_group_while_probing_health(target))
        stats = httpx.get(f"{judge_url}/stats", timeout=10).json()

    # 4 pairs (circular), each tried 4 times (genrm_parse_retries = 3), all adversarial.
    assert stats["by_outcome"] == {"adversarial": 16}
    assert statuses and set(statuses) == {health_pb2.HealthCheckResponse.SERVING}
    assert sorted(r.member.rollout_index for r in results) == [0, 1, 2, 3]
    assert not any(r.mask_sample for r in results)
    # Every pair fell back to the default verdict (3, 3, 3.5): all members tie.
    assert len({r.reward for r in results}) == 1
    assert all(r.group_metrics["genrm_parse_failure_rate_per_group"] == 1.0 for r in results)
