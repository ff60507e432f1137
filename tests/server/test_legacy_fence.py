"""A legacy cohort (no group_id) whose judge failed stays fenced, over real gRPC."""

from __future__ import annotations

import asyncio

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient

from genrm_grpc.cohort.model import LEGACY_RETRY_ADVICE
from genrm_grpc.testing import FakeJudgeServer

from .conftest import PROMPT, StartServer, candidate, member


async def _legacy_group(client: CohortClient, *, variant: str = "") -> list[pb.MemberResult]:
    calls = [
        client.submit_member(
            member(k, group=None, attempt=None, task_index=11),
            PROMPT,
            candidate(k, variant=variant),
            timeout=30,
        )
        for k in range(4)
    ]
    return list(await asyncio.gather(*calls))


async def test_a_legacy_group_whose_judge_failed_is_never_judged_again_nor_mixed(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_503_rate=1.0)
    # One judge call at a time: the first 503 masks the cohort before another pass is
    # sent, so no request of the failed run can reach the judge after `calls` is read.
    _, client = await start_server(genrm_parse_retries=0, judge_max_concurrency=1)
    first = await _legacy_group(client)
    assert all(r.mask_sample and not r.replayed for r in first)
    assert all(LEGACY_RETRY_ADVICE in r.failure_reason for r in first)
    calls = fake_judge.stats()["total"]
    fake_judge.set_faults(fail_503_rate=0.0)  # the judge has recovered

    # (a) the same members again: the recorded masked result, not ordinary rewards.
    again = await _legacy_group(client)
    # (b) a regenerated run under the same legacy key, with a delayed member of the
    # failed run among it: nothing is judged, nothing is mixed.
    rerun = await _legacy_group(client, variant=" (regenerated)")
    for r in (*again, *rerun):
        assert r.mask_sample and r.replayed
        assert r.failure_kind == pb.FAILURE_KIND_JUDGE_FAILED
        assert "503" in r.failure_reason and LEGACY_RETRY_ADVICE in r.failure_reason
    assert fake_judge.stats()["total"] == calls


async def test_a_masked_explicit_group_recovers_under_a_newer_attempt(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_503_rate=1.0)
    _, client = await start_server(genrm_parse_retries=0)
    masked = await asyncio.gather(
        *(client.submit_member(member(k), PROMPT, candidate(k), timeout=30) for k in range(4))
    )
    assert all(r.mask_sample and LEGACY_RETRY_ADVICE not in r.failure_reason for r in masked)
    fake_judge.set_faults(fail_503_rate=0.0)
    fresh = await asyncio.gather(
        *(
            client.submit_member(member(k, attempt=1), PROMPT, candidate(k), timeout=30)
            for k in range(4)
        )
    )
    assert not any(r.mask_sample for r in fresh)
