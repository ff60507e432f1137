"""What the judge client reports to its observer, per attempt and per comparison.

The judge is the real fake judge over loopback HTTP, with faults injected per request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from genrm_grpc.judge.client import JudgeClient, JudgeClientConfig, JudgeFailedError, JudgeInput
from genrm_grpc.judge.fake import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.observability.metrics import ServerMetrics

INPUT = JudgeInput((("user", "Name a prime."),), "Seven.", "Four.")


def _client(fake: FakeJudgeServer, metrics: ServerMetrics, **config: Any) -> JudgeClient:
    async def no_sleep(_seconds: float) -> None:
        return None

    return JudgeClient(
        JudgeClientConfig(url=fake.url, api="responses", model="genrm", **config),
        sleep=no_sleep,
        observer=metrics,
    )


def _value(metrics: ServerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_retried_then_ok_counts_each_attempt_and_one_comparison() -> None:
    metrics = ServerMetrics()
    faults = FakeJudgeConfig(fail_503_first_n=1, fail_429_first_n=2, retry_after_s=None)
    with FakeJudgeServer(faults) as fake:
        async with _client(fake, metrics) as client:
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
    with FakeJudgeServer(FakeJudgeConfig(malformed_rate=1.0)) as fake:
        async with _client(fake, metrics, parse_retries=1) as client:
            out = await client.judge(INPUT)
    assert out.verdict.parse_failed
    assert _value(metrics, "genrm_judge_requests_total", outcome="unparseable") == 2
    assert _value(metrics, "genrm_judge_retries_total", cause="unparseable") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="default_verdict") == 1


async def test_final_failures_are_counted_by_kind() -> None:
    metrics = ServerMetrics()
    with FakeJudgeServer(FakeJudgeConfig(fail_400_rate=1.0)) as fake:
        async with _client(fake, metrics) as client:
            with pytest.raises(JudgeFailedError):
                await client.judge(INPUT)
    assert _value(metrics, "genrm_judge_requests_total", outcome="http_400") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="failed") == 1

    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as fake:
        async with _client(fake, metrics, request_timeout_s=0.2) as client:
            with pytest.raises(JudgeFailedError):
                await client.judge(INPUT)
    assert _value(metrics, "genrm_judge_requests_total", outcome="deadline") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="failed") == 2


async def test_a_cancelled_comparison_is_counted_as_cancelled() -> None:
    metrics = ServerMetrics()
    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as fake:
        async with _client(fake, metrics) as client:
            task = asyncio.create_task(client.judge(INPUT))
            assert await asyncio.to_thread(fake.wait_for_requests, 1, 10.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert _value(metrics, "genrm_judge_requests_total", outcome="cancelled") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="cancelled") == 1
