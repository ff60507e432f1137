"""``judge.stream`` end to end: a real ``serve`` process in front of fake-judge farm nodes
(real HTTP processes on loopback, streaming server-sent events; every latency here is
simulated). Waits go through the nodes' ``GET /wait`` long-poll or poll another
process's state; no sleep stands in for an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from tests.e2e.test_judge_farm import (
    NODE,
    _eventually,
    _farm,
    _request,
    _run_groups,
    _serving,
    _state,
)

pytestmark = pytest.mark.e2e

STREAM = {"GENRM_JUDGE__STREAM": "true"}


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_a_node_that_sends_no_first_token_is_ejected_and_costs_no_reward_nor_the_timeout(
    tmp_path: Path, api: str
) -> None:
    groups, size = 16, 4
    with (
        _farm(2, *NODE) as nodes,
        _serving(
            nodes,
            tmp_path,
            **STREAM,
            GENRM_JUDGE__API=api,
            GENRM_JUDGE__FIRST_TOKEN_TIMEOUT_S="0.5",
            GENRM_JUDGE_REQUEST_TIMEOUT_S="600",
            GENRM_JUDGE_MAX_CONCURRENCY="8",
            GENRM_JUDGE__OUTLIER_BASE_EJECTION_S="600",
        ) as server,
    ):
        # Accepts, answers HTTP 200 and the stream's opening event, then no token.
        nodes[0].control(mode="stall")
        started = time.monotonic()
        results = asyncio.run(_run_groups(server.target, groups, size))
        took = time.monotonic() - started
        timeouts = server.metric("genrm_judge_first_token_timeouts_total")
        outcomes = server.metric('genrm_judge_requests_total{outcome="first_token"}')
        # Every request it got was closed by the client: counted hung, then aborted.
        stalled = nodes[0].wait_for(aborted=int(timeouts))
        assert _state(server, nodes[0], "ejected") == 1
        completed = nodes[1].stats()["node"]["completed"]
    assert not any(r.mask_sample for r in results)
    assert took < 60, took  # far below the 600 s request timeout
    assert timeouts >= 3  # judge.outlier_consecutive_failures, then ejected
    assert outcomes == timeouts
    assert stalled["hung"] == stalled["aborted"] == timeouts
    assert completed == groups * size  # every pass, answered by the healthy node


def test_a_superseded_attempts_streamed_requests_are_closed_at_the_judge(
    tmp_path: Path,
) -> None:
    # Slow nodes: an attempt's passes are all streaming when the next attempt arrives.
    slow = ("--slots", "8", "--tokens-per-s", "20", "--output-tokens", "6000")
    with (
        _farm(2, *slow) as nodes,
        _serving(nodes, tmp_path, **STREAM, GENRM_JUDGE_MAX_CONCURRENCY="8") as server,
    ):

        async def run() -> None:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = pb_grpc.CohortServiceStub(channel)
                old = [
                    asyncio.ensure_future(stub.SubmitMember(_request(0, k, 4), timeout=120))
                    for k in range(4)
                ]
                # Each of the 4 streams has sent tokens: the aborts cut live streams.
                await asyncio.to_thread(
                    _eventually,
                    lambda: server.metric("genrm_judge_streamed_tokens_in_flight") >= 40,
                )
                newer = stub.SubmitMember(_request(0, 0, 4, attempt=1), timeout=5)
                with contextlib.suppress(grpc.RpcError):
                    await newer  # waits for its siblings: its deadline ends it
                for call in old:
                    with pytest.raises(grpc.RpcError) as excinfo:
                        await call
                    assert excinfo.value.code() == grpc.StatusCode.ABORTED

        asyncio.run(run())
        aborted = sum(n.wait_for(aborted=0)["aborted"] for n in nodes)
        running = sum(n.stats()["node"]["aborted_running"] for n in nodes)
        streamed = server.metric("genrm_judge_streamed_tokens_in_flight")
        cancelled = server.metric('genrm_judge_requests_total{outcome="cancelled"}')
    assert aborted == running == 4  # every streaming request of the old attempt, closed
    assert cancelled == 4
    assert streamed == 0  # the gauge lets go of closed requests


def test_get_cohort_shows_the_comparisons_in_flight_and_the_tokens_they_streamed(
    tmp_path: Path,
) -> None:
    # Each pass streams 300 tokens over 6 s of simulated decode time.
    slow = ("--slots", "4", "--tokens-per-s", "50", "--output-tokens", "300")
    with (
        _farm(1, *slow) as nodes,
        _serving(nodes, tmp_path, **STREAM, GENRM_JUDGE_MAX_CONCURRENCY="4") as server,
    ):

        async def run() -> list[pb.CohortInfo]:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = pb_grpc.CohortServiceStub(channel)
                calls = [
                    asyncio.ensure_future(stub.SubmitMember(_request(0, k, 2), timeout=120))
                    for k in range(2)
                ]
                ref = pb.MemberRef(group_id="farm-0", group_attempt=0, group_size=2)
                seen: list[pb.CohortInfo] = []

                async def streamed(at_least: int) -> pb.CohortInfo:
                    while True:
                        try:
                            reply = await stub.GetCohort(pb.GetCohortRequest(member=ref))
                        except grpc.RpcError as exc:  # its members are still on their way
                            assert exc.code() == grpc.StatusCode.NOT_FOUND
                        else:
                            if reply.cohort.judge_tokens_streamed >= at_least:
                                return reply.cohort
                        await asyncio.sleep(0.05)  # polling another process, not a wait

                seen.append(await asyncio.wait_for(streamed(20), 30))
                seen.append(
                    await asyncio.wait_for(streamed(seen[0].judge_tokens_streamed + 20), 30)
                )
                replies = await asyncio.gather(*calls)
                assert not any(r.result.mask_sample for r in replies)
                seen.append((await stub.GetCohort(pb.GetCohortRequest(member=ref))).cohort)
                return seen

        first, later, done = asyncio.run(run())
        gauge = server.metric("genrm_judge_streamed_tokens_in_flight")
    assert first.phase == pb.COHORT_PHASE_EVALUATING
    assert first.judge_in_flight == later.judge_in_flight == 2  # circular: 2 passes of 2
    assert later.judge_tokens_streamed > first.judge_tokens_streamed  # it moves as they run
    assert later.judge_tokens_streamed < 2 * 300
    assert done.phase == pb.COHORT_PHASE_COMPLETED
    assert done.judge_in_flight == done.judge_tokens_streamed == 0
    assert gauge == 0  # nothing in flight any more
