"""What the judge client reports to its observer, per attempt and per comparison.

The judge is the real fake judge (``genrm-grpc fake-judge``) in its own process, with
faults injected per request.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from genrm_grpc.judge.client import JudgeClient, JudgeFailedError, JudgeInput
from genrm_grpc.observability.metrics import ServerMetrics
from tests.judge.processes import FakeJudgeProcess
from tests.judge.views import judge_settings

INPUT = JudgeInput((("user", "Name a prime."),), "Seven.", "Four.")


def _client(judge: FakeJudgeProcess, metrics: ServerMetrics, **config: Any) -> JudgeClient:
    async def no_sleep(_seconds: float) -> None:
        return None

    return JudgeClient(
        judge_settings(judge.url, api="responses", model="genrm", **config),
        sleep=no_sleep,
        observer=metrics,
    )


def _value(metrics: ServerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_retried_then_ok_counts_each_attempt_and_one_comparison() -> None:
    metrics = ServerMetrics()
    faults = ("--fail-503-first-n", "1", "--fail-429-first-n", "2", "--retry-after-s", "-1")
    with FakeJudgeProcess(None, *faults) as judge:
        async with _client(judge, metrics) as client:
            out = await client.judge(INPUT)
    assert out.attempts == 3
    assert _value(metrics, "genrm_judge_requests_total", outcome="http_503") == 1
    assert _value(metrics, "genrm_judge_requests_total", outcome="http_429") == 1
    assert _value(metrics, "genrm_judge_requests_total", outcome="ok") == 1
    assert _value(metrics, "genrm_judge_retries_total", cause="http_503") == 1
    assert _value(metrics, "genrm_judge_retries_total", cause="http_429") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="ok") == 1
    assert _value(metrics, "genrm_judge_request_duration_seconds_count") == 3
    assert _value(metrics, "genrm_judge_comparison_duration_seconds_count") == 1


async def test_unparseable_answers_end_in_the_default_verdict() -> None:
    metrics = ServerMetrics()
    with FakeJudgeProcess(None, "--malformed-rate", "1") as judge:
        async with _client(judge, metrics, genrm_parse_retries=1) as client:
            out = await client.judge(INPUT)
    assert out.verdict.parse_failed
    assert _value(metrics, "genrm_judge_requests_total", outcome="unparseable") == 2
    assert _value(metrics, "genrm_judge_retries_total", cause="unparseable") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="default_verdict") == 1


async def test_final_failures_are_counted_by_kind() -> None:
    metrics = ServerMetrics()
    with FakeJudgeProcess(None, "--fail-400-rate", "1") as judge:
        async with _client(judge, metrics) as client:
            with pytest.raises(JudgeFailedError):
                await client.judge(INPUT)
    assert _value(metrics, "genrm_judge_requests_total", outcome="http_400") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="failed") == 1

    with FakeJudgeProcess(None, "--hang-rate", "1") as judge:
        async with _client(judge, metrics, judge_request_timeout_s=0.2) as client:
            with pytest.raises(JudgeFailedError):
                await client.judge(INPUT)
    assert _value(metrics, "genrm_judge_requests_total", outcome="deadline") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="failed") == 2


def _wait_for_a_request(judge: FakeJudgeProcess) -> bool:
    deadline = time.monotonic() + 30
    while judge.stats()["total"] < 1:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def test_a_cancelled_comparison_is_counted_as_cancelled() -> None:
    metrics = ServerMetrics()
    with FakeJudgeProcess(None, "--hang-rate", "1") as judge:
        async with _client(judge, metrics) as client:
            task = asyncio.create_task(client.judge(INPUT))
            assert await asyncio.to_thread(_wait_for_a_request, judge)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert _value(metrics, "genrm_judge_requests_total", outcome="cancelled") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="cancelled") == 1
