"""The judge is part of readiness: start-up probe, NOT_SERVING after the window, recovery."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genrm_grpc.judge.client import JudgeClient, JudgeFailedError, JudgeInput
from genrm_grpc.judge.readiness import JudgeMonitor, JudgeReadiness
from tests.judge.processes import FakeJudgeProcess, ServerProcess, free_port
from tests.judge.views import judge_settings

SERVICE = "genrm.cohort.v1.CohortService"


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_readiness_turns_false_only_after_the_window_of_continuous_unreachability() -> None:
    clock = ManualClock()
    readiness = JudgeReadiness(10.0, clock=clock)
    assert readiness.ready() and readiness.reachable

    readiness.judge_unreachable("refused")
    clock.now = 10.0
    assert readiness.ready()  # exactly the window: still ready
    readiness.judge_unreachable("refused again")  # does not restart the window
    clock.now = 10.5
    assert not readiness.ready()
    assert readiness.unreachable_for() == pytest.approx(10.5)

    readiness.judge_reachable()
    assert readiness.ready() and readiness.unreachable_for() == 0.0
    readiness.judge_unreachable("refused")
    clock.now = 15.0
    assert readiness.ready()  # a new outage starts a new window


async def test_monitor_reports_not_ready_after_the_window_and_ready_when_the_judge_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="genrm_grpc.judge.readiness")
    judge = FakeJudgeProcess()  # not started yet: nothing listens on its port
    clock = ManualClock()
    readiness = JudgeReadiness(1.0, clock=clock)
    changes: list[bool] = []
    changed = asyncio.Event()

    async def on_change(ready: bool) -> None:
        changes.append(ready)
        changed.set()

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        if changes == [False] and judge.proc is None:
            await asyncio.to_thread(judge.start)

    config = judge_settings(judge.url, api="responses", model="genrm")
    async with JudgeClient(config) as client:
        monitor = JudgeMonitor(
            client,
            readiness,
            probe="startup",
            probe_timeout_s=5.0,
            on_change=on_change,
            sleep=sleep,
        )
        task = asyncio.create_task(monitor.run())
        try:
            await asyncio.wait_for(changed.wait(), 30)
            changed.clear()
            assert changes == [False]
            assert clock.now > 1.0
            await asyncio.wait_for(changed.wait(), 30)
            assert changes == [False, True]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            judge.stop()

    startup = [r for r in caplog.records if getattr(r, "judge_event", None) == "probe"]
    assert len(startup) == 1
    assert "judge unreachable at" in startup[0].getMessage()
    assert "api responses, model genrm" in startup[0].getMessage()


async def test_traffic_failures_alone_make_the_judge_unready_with_probes_off() -> None:
    clock = ManualClock()
    readiness = JudgeReadiness(2.0, clock=clock)
    config = judge_settings(
        f"http://127.0.0.1:{free_port()}", api="responses", model="genrm", genrm_parse_retries=0
    )
    async with JudgeClient(config, connect_retries=0, reachability=readiness) as client:
        with pytest.raises(JudgeFailedError, match="cannot connect"):
            await client.judge(JudgeInput((("user", "hi"),), "a", "b"))
    assert not readiness.reachable
    clock.now = 2.5
    assert not readiness.ready()


# -- end to end: real server and fake judge processes ------------------------------------


def _health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return int(reply.status)


def _judge_ready_metric(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("genrm_judge_ready "):
                return float(line.split()[1])
    raise AssertionError("genrm_judge_ready is not exported")


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll a condition that a real process brings about (bounded, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.e2e
def test_server_without_a_judge_is_not_serving_for_cohorts_until_the_judge_starts() -> None:
    judge = FakeJudgeProcess()  # its port stays free until the judge starts
    metrics_port = free_port()
    env = {
        "GENRM_JUDGE__URL": judge.url,
        "GENRM_JUDGE__MODEL": "genrm-test",
        "GENRM_JUDGE_UNREACHABLE_WINDOW_S": "0.4",
        "GENRM_JUDGE_PROBE_TIMEOUT_S": "2",
        "GENRM_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
    }
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    try:
        with ServerProcess(env) as server:
            _until(lambda: _health(server.target, SERVICE) == not_serving, "NOT_SERVING")
            assert _health(server.target, "") == serving  # liveness is unaffected
            assert _judge_ready_metric(metrics_port) == 0.0
            judge.start()
            _until(lambda: _health(server.target, SERVICE) == serving, "SERVING again")
            assert _health(server.target, "") == serving
            assert _judge_ready_metric(metrics_port) == 1.0
            server.stop()
            lines = [json.loads(line) for line in server.log_lines() if line.startswith("{")]
    finally:
        judge.stop()

    probe_lines = [e for e in lines if e.get("judge_event") == "probe"]
    assert len(probe_lines) == 1
    assert "judge unreachable at" in probe_lines[0]["msg"]
    assert probe_lines[0]["judge_url"] == judge.url
    assert probe_lines[0]["judge_model"] == "genrm-test"
    events = [e["judge_event"] for e in lines if "judge_event" in e]
    assert events == ["probe", "not_serving", "serving"]


async def test_with_the_probe_off_the_start_up_line_names_the_judge_and_nothing_is_probed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="genrm_grpc.judge.readiness")
    readiness = JudgeReadiness(1.0, clock=ManualClock())
    changes: list[bool] = []

    async def on_change(ready: bool) -> None:
        changes.append(ready)

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a probe would fail
    async with JudgeClient(judge_settings(url, api="responses", model="m")) as client:
        monitor = JudgeMonitor(
            client, readiness, probe="off", probe_timeout_s=5.0, on_change=on_change
        )
        task = asyncio.create_task(monitor.run())
        await asyncio.sleep(0)  # the start-up line is logged before the first await
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    events = [getattr(r, "judge_event", None) for r in caplog.records]
    assert events == ["configured"]
    assert url in caplog.records[0].getMessage()
    assert readiness.reachable and changes == []
