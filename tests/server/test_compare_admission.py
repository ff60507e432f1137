"""Compare fan-out is admission-controlled: a bound on queued passes, typed refusal."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import error_info

from genrm_grpc.testing import FakeJudgeServer

from .conftest import PROMPT, StartServer, candidate


async def test_compare_passes_beyond_the_queue_bound_are_capacity_exhausted(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(hang_rate=1.0)
    server, client = await start_server(max_queued_compare_passes=4, judge_max_concurrency=1)
    big = asyncio.ensure_future(
        client.stub.Compare(
            pb.CompareRequest(prompt=PROMPT, candidates=[candidate(k) for k in range(6)]),
            timeout=30,
        )
    )
    assert await asyncio.to_thread(fake_judge.wait_for_requests, 1, 10)
    assert server.runtime.stats()["compare_passes"] == 6
    with pytest.raises(grpc.RpcError) as caught:
        await client.stub.Compare(
            pb.CompareRequest(prompt=PROMPT, candidates=[candidate(0), candidate(1)]), timeout=10
        )
    err = error_info(caught.value)
    assert (err.code, err.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "CAPACITY_EXHAUSTED")
    assert "max_queued_compare_passes=4" in err.message
    big.cancel()
    await asyncio.gather(big, return_exceptions=True)
    fake_judge.set_faults(hang_rate=0.0)
