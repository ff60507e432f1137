"""The hardening items as users meet them: the real server and fake-judge executables.

Legacy judge-failure fencing, the judge-pass bound, deep JSON nesting, over-long ids
and the Compare wait cap, each against ``genrm-grpc serve`` in its own process.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import grpc
import httpx
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import ErrorDetails, error_info

from genrm_grpc.demo import running_stack

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
ADVICE = "regenerate the whole group under a fresh group_id"


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    os.environ["GENRM_MAX_CALL_WAIT_S"] = "1"
    try:
        with running_stack(
            ["--comparison-strategy", "all_pairs", "--genrm-parse-retries", "0"]
        ) as (judge_url, target):
            yield judge_url, target
    finally:
        del os.environ["GENRM_MAX_CALL_WAIT_S"]


def _faults(judge_url: str, **changes: float) -> None:
    httpx.post(f"{judge_url}/faults", json=changes, timeout=10).raise_for_status()


def _judged(judge_url: str) -> int:
    total: int = httpx.get(f"{judge_url}/stats", timeout=10).json()["total"]
    return total


async def _error(call: object) -> ErrorDetails:
    with pytest.raises(grpc.RpcError) as caught:
        await call  # type: ignore[misc]
    return error_info(caught.value)


def _legacy(k: int, answer: str) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(task_index=4242, rollout_index=k, group_size=3),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=answer),
    )


async def _legacy_run(stub: pb_grpc.CohortServiceStub, tag: str) -> list[pb.MemberResult]:
    calls = [stub.SubmitMember(_legacy(k, f"{tag} {k}"), timeout=30) for k in range(3)]
    return [r.result for r in await asyncio.gather(*calls)]


def test_the_hardening_items_hold_against_the_real_executables(
    stack: tuple[str, str],
) -> None:
    judge_url, target = stack

    async def exercise() -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.CohortServiceStub(channel)

            # Legacy judge failure: fenced; neither a resend nor a rerun is judged.
            _faults(judge_url, fail_503_rate=1.0)
            failed = await _legacy_run(stub, "seven")
            assert all(r.mask_sample and ADVICE in r.failure_reason for r in failed)
            _faults(judge_url, fail_503_rate=0.0)
            judged = _judged(judge_url)
            for tag in ("seven", "eleven"):  # the same members, then a regenerated run
                again = await _legacy_run(stub, tag)
                assert all(r.mask_sample and r.replayed for r in again)
            assert _judged(judge_url) == judged

            # A tiny member declaring a group whose all_pairs would need 8M passes.
            huge = pb.SubmitMemberRequest(
                member=pb.MemberRef(group_id="huge", rollout_index=0, group_size=4096),
                prompt=PROMPT,
                candidate=pb.Candidate(output_text="x"),
            )
            err = await _error(stub.SubmitMember(huge, timeout=10))
            assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMBER")

            # Nesting just below the JSON codec's recursion limit.
            deep = pb.Candidate(responses_api_json='{"a": ' * 980 + "1" + "}" * 980)
            err = await _error(
                stub.SubmitMember(
                    pb.SubmitMemberRequest(member=huge.member, prompt=PROMPT, candidate=deep),
                    timeout=10,
                )
            )
            assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMBER")

            # Over-long ids on GetCohort: typed, and the ErrorInfo arrives.
            for ref in (pb.MemberRef(group_id="é" * 50_000), pb.MemberRef(prompt_id="p" * 9000)):
                err = await _error(stub.GetCohort(pb.GetCohortRequest(member=ref), timeout=10))
                assert (err.code, err.reason) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "INVALID_MEMBER",
                )

            # A Compare without a deadline against a hanging judge: capped, typed.
            _faults(judge_url, hang_rate=1.0)
            candidates = [pb.Candidate(output_text=a) for a in ("Seven.", "Four.")]
            err = await _error(
                stub.Compare(pb.CompareRequest(prompt=PROMPT, candidates=candidates))
            )
            assert (err.code, err.reason) == (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "CALL_WAIT_EXPIRED",
            )
            _faults(judge_url, hang_rate=0.0)

    asyncio.run(exercise())
