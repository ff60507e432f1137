"""What the judge client reports to its observer, per attempt and per comparison."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from genrm_grpc.judge.client import JudgeClient, JudgeClientConfig, JudgeFailedError, JudgeInput
from genrm_grpc.observability.metrics import ServerMetrics

INPUT = JudgeInput((("user", "Name a prime."),), "Seven.", "Four.")
VERDICT = 'Seven is right.\n```json\n{"score_1": 5, "score_2": 1, "ranking": 1}\n```'


def _answer(text: str) -> httpx.Response:
    body = {
        "status": "completed",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
    }
    return httpx.Response(200, content=json.dumps(body).encode())


def _client(
    handler: Callable[[httpx.Request], httpx.Response], metrics: ServerMetrics, **config: float
) -> JudgeClient:
    async def no_sleep(_seconds: float) -> None:
        return None

    return JudgeClient(
        JudgeClientConfig(url="http://judge.invalid", api="responses", model="genrm", **config),  # type: ignore[arg-type]
        transport=httpx.MockTransport(handler),
        sleep=no_sleep,
        observer=metrics,
    )


def _value(metrics: ServerMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_retried_then_ok_counts_each_attempt_and_one_comparison() -> None:
    metrics = ServerMetrics()
    replies = iter([httpx.Response(503), httpx.Response(429), _answer(VERDICT)])
    async with _client(lambda _r: next(replies), metrics) as client:
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
    async with _client(lambda _r: _answer("no verdict here"), metrics, parse_retries=1) as client:
        out = await client.judge(INPUT)
    assert out.verdict.parse_failed
    assert _value(metrics, "genrm_judge_requests_total", outcome="unparseable") == 2
    assert _value(metrics, "genrm_judge_retries_total", cause="unparseable") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="default_verdict") == 1


async def test_final_failures_are_counted_by_kind() -> None:
    metrics = ServerMetrics()
    async with _client(lambda _r: httpx.Response(400), metrics) as client:
        with pytest.raises(JudgeFailedError):
            await client.judge(INPUT)
    assert _value(metrics, "genrm_judge_requests_total", outcome="http_400") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="failed") == 1

    def hang(_request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("judge too slow")

    async with _client(hang, metrics) as client:
        with pytest.raises(JudgeFailedError):
            await client.judge(INPUT)
    assert _value(metrics, "genrm_judge_requests_total", outcome="deadline") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="failed") == 2


async def test_a_cancelled_comparison_is_counted_as_cancelled() -> None:
    metrics = ServerMetrics()
    entered = asyncio.Event()

    async def handler(_request: httpx.Request) -> httpx.Response:
        entered.set()
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    async with _client(handler, metrics) as client:  # type: ignore[arg-type]
        task = asyncio.create_task(client.judge(INPUT))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _value(metrics, "genrm_judge_requests_total", outcome="cancelled") == 1
    assert _value(metrics, "genrm_judge_comparisons_total", outcome="cancelled") == 1
