"""max_concurrent_rpcs: the server refuses calls past its bound with a typed, retryable error.

A real server on loopback, the fake judge over HTTP. Waiting members hold their calls,
so four waiting members of a group of five fill a limit of four: the fifth member is
refused with UNAVAILABLE / SERVER_OVERLOADED (never reaching a cohort), the retrying
client resends it, and once one waiting call ends the resend gets in and the group is
judged whole.
"""

from __future__ import annotations

import asyncio

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import CohortClient, error_info
from genrm_cohort_client.options import RetryPolicy
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genrm_grpc.testing import FakeJudgeServer

from .conftest import PROMPT, StartServer, SubmitProbe, candidate, member

SIZE = 5
LIMIT = 4


def _request(k: int) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=member(k, size=SIZE), prompt=PROMPT, candidate=candidate(k)
    )


async def test_calls_past_max_concurrent_rpcs_get_server_overloaded_and_a_resend_gets_in(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server, _ = await start_server(max_concurrent_rpcs=LIMIT)
    probe = SubmitProbe(server)
    refusals = 0
    refused_again = asyncio.Event()
    counted = server.call_limit.on_refused
    assert counted is not None

    def on_refused() -> None:
        nonlocal refusals
        counted()
        refusals += 1
        if refusals >= 3:  # the raw call's refusal, then two of the client's resends
            refused_again.set()

    server.call_limit.on_refused = on_refused
    target = f"127.0.0.1:{server.port}"
    retrying = CohortClient(
        target,
        retry=RetryPolicy(
            max_attempts=10_000, initial_backoff_s=0.01, max_backoff_s=0.05, jitter_s=0.0
        ),
    )
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        waiting = [stub.SubmitMember(_request(k), timeout=60) for k in range(LIMIT)]
        await probe.reached(LIMIT)
        assert server.call_limit.in_progress == LIMIT

        try:
            await stub.SubmitMember(_request(LIMIT), timeout=10)
        except grpc.RpcError as exc:
            err = error_info(exc)
        else:
            raise AssertionError("a call past max_concurrent_rpcs was taken")
        assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, "SERVER_OVERLOADED")
        assert err.metadata == {"maxConcurrentRpcs": str(LIMIT)}
        assert probe.count == LIMIT  # refused before it reached a cohort

        # Probes are never counted nor refused: an overloaded server is still serving.
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        resent = asyncio.ensure_future(
            retrying.submit_member(member(LIMIT, size=SIZE), PROMPT, candidate(LIMIT), timeout=60)
        )
        await refused_again.wait()
        assert not resent.done()

        # One waiting call ends (its member stays in the cohort): the resend gets in.
        waiting[-1].cancel()
        result = await resent
        results = [r.result for r in await asyncio.gather(*waiting[:-1])]
        assert not result.mask_sample and all(not r.mask_sample for r in results)
        assert retrying.stats.retries_by_reason.get("UNAVAILABLE/SERVER_OVERLOADED", 0) >= 2

        # The member whose call was cancelled was judged with its group: it replays.
        again = await stub.SubmitMember(_request(LIMIT - 1), timeout=10)
        assert again.result.replayed
    await retrying.close()
    assert fake_judge.stats()["total"] == SIZE  # one circular pass per member, none repeated
    exposition = server.metrics.exposition().decode()
    assert f"genrm_calls_refused_overloaded_total {float(refusals)}" in exposition
    assert server.call_limit.in_progress == 0
