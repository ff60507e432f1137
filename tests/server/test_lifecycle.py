"""SIGTERM drain of the real executable, and ``genrm-grpc health`` as a probe.

The server runs as a subprocess; the fake judge runs in this process and hangs every
request, so a cohort stays evaluating for as long as the test wants. Ordering comes from
the protocol itself (acceptance events, the health Watch stream), never from sleeping.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _member(group: str, k: int) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(group_id=group, group_attempt=0, rollout_index=k, group_size=2),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=f"answer {k}"),
    )


def _reason(status: status_pb2.Status) -> str:
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    raise AssertionError(f"no ErrorInfo in {status}")


def _rpc_status(exc: grpc.RpcError) -> status_pb2.Status:
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    raise AssertionError(f"no rich status in {exc}")


@pytest.fixture
def server_process() -> Iterator[Any]:
    """Start ``genrm-grpc serve`` against a hanging fake judge; yields (proc, target, judge)."""
    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as judge:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "genrm_grpc.cli", "serve",
                "--listen", "127.0.0.1:0",
                "--judge-url", judge.url,
                "--shutdown-grace-s", "300",
                "--genrm-parse-retries", "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("genrm-grpc serving on "), line
            yield proc, line.split()[-1], judge
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()
            if proc.stderr is not None:
                proc.stderr.close()


async def _health_cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "genrm_grpc.cli", "health", *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def _next(call: Any, kind: str) -> Any:
    event = await call.read()
    assert event.WhichOneof("event") == kind, event
    return getattr(event, kind)


async def _evaluating_and_collecting(cohorts: Any) -> tuple[Any, Any]:
    """Two streams: cohort "eval" is full, so it is evaluating (its judge call hangs);
    cohort "open" is collecting (one of its two members arrived)."""
    evaluating = cohorts.StreamGroups()
    for k in range(2):
        await evaluating.write(pb.StreamGroupsRequest(member=_member("eval", k)))
    await _next(evaluating, "accepted")
    await _next(evaluating, "accepted")
    await evaluating.done_writing()
    collecting = cohorts.StreamGroups()
    await collecting.write(pb.StreamGroupsRequest(member=_member("open", 0)))
    await _next(collecting, "accepted")
    await collecting.done_writing()
    return evaluating, collecting


@pytest.mark.stores("sqlite")
async def test_sigterm_drains_keeps_collecting_cohorts_for_the_next_process_and_exits_zero(
    server_process: Any,
) -> None:
    proc, target, judge = server_process
    code, out = await _health_cli("--server", target)
    assert (code, out.strip()) == (0, f"{target} genrm.cohort.v1.CohortService: SERVING")

    async with grpc.aio.insecure_channel(target) as channel:
        cohorts = pb_grpc.CohortServiceStub(channel)
        evaluating, collecting = await _evaluating_and_collecting(cohorts)
        # The same member again on a unary call: it attaches and waits as well.
        unary = asyncio.ensure_future(cohorts.SubmitMember(_member("open", 0), timeout=60))

        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (await watch.read()).status == SERVING
        proc.send_signal(signal.SIGTERM)
        assert (await watch.read()).status == NOT_SERVING
        watch.cancel()

        # Draining: the server sent GOAWAY and closed its listener, so the probe fails
        # and new calls are refused as UNAVAILABLE (retry the same call elsewhere),
        # while the evaluating cohort still has its grace period.
        code, out = await _health_cli("--target", target)
        assert code == 1 and "UNAVAILABLE" in out
        with pytest.raises(grpc.RpcError) as refused:
            await cohorts.SubmitMember(_member("late", 0), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert proc.poll() is None

        # Releasing the hung judge requests ends the evaluation (masked: the judge
        # failed), which ends the grace period. The collecting cohort is kept in the
        # store for the next process: its waiting calls are interrupted, not failed.
        judge.stop()
        for _ in range(2):
            result = await _next(evaluating, "result")
            assert result.mask_sample and result.failure_kind == pb.FAILURE_KIND_JUDGE_FAILED
        error = await _next(collecting, "error")
        assert error.status.code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert _reason(error.status) == "SHUTTING_DOWN"
        assert "kept in its store" in error.status.message
        with pytest.raises(grpc.RpcError) as interrupted:
            await unary
        assert interrupted.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "kept in its store" in (interrupted.value.details() or "")

    assert await asyncio.to_thread(proc.wait, 60) == 0
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert '"msg": "draining"' in log and '"msg": "stopped"' in log


@pytest.mark.stores("sqlite")
async def test_a_second_sigterm_during_the_drain_ends_the_grace_and_exits_zero(
    server_process: Any,
) -> None:
    """Repeated signals never kill the drain: the second one ends the grace period now,
    every waiting call gets a typed status, and the exit code is 0."""
    proc, target, _judge = server_process
    async with grpc.aio.insecure_channel(target) as channel:
        cohorts = pb_grpc.CohortServiceStub(channel)
        evaluating, collecting = await _evaluating_and_collecting(cohorts)
        # Unary waiters on both cohorts (identical resends: they attach).
        unary = [
            asyncio.ensure_future(cohorts.SubmitMember(_member(group, 0), timeout=120))
            for group in ("eval", "open", "eval")
        ]
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == SERVING
        proc.send_signal(signal.SIGTERM)
        assert (await watch.read()).status == NOT_SERVING  # the drain has started
        watch.cancel()
        # The judge hangs and the grace is 300 s: only the second signal ends the drain.
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGINT)  # and a third: still idempotent

        # Both cohorts stay in the store for the next process; every waiting call is
        # interrupted with a typed, retryable status.
        for call, members in ((evaluating, 2), (collecting, 1)):
            for _ in range(members):
                error = await _next(call, "error")
                assert error.status.code == grpc.StatusCode.UNAVAILABLE.value[0]
                assert _reason(error.status) == "SHUTTING_DOWN"
                assert "kept in its store" in error.status.message
        for waiting in unary:
            with pytest.raises(grpc.RpcError) as interrupted:
                await waiting
            assert interrupted.value.code() == grpc.StatusCode.UNAVAILABLE
            assert _reason(_rpc_status(interrupted.value)) == "SHUTTING_DOWN"

    assert await asyncio.to_thread(proc.wait, 60) == 0
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert '"msg": "stopped"' in log and "second signal" in log
    assert "Traceback" not in log


async def test_health_command_fails_when_nothing_serves() -> None:
    code, out = await _health_cli("--server", "127.0.0.1:1", "--timeout-s", "2")
    assert code == 1 and "UNAVAILABLE" in out
