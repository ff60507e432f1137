"""Response bodies are capped, and large ones are decoded off the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeClient, JudgeFailedError
from tests.judge.processes import FakeJudgeProcess
from tests.judge.views import PLANET, judge_settings, no_sleep


def _config(url: str, *, max_response_bytes: int | None = None, **overrides: Any) -> Settings:
    settings = judge_settings(url, **{"api": "responses", "model": "genrm", **overrides})
    if max_response_bytes is None:
        return settings
    # Below the 1024-byte floor of judge.max_response_bytes on purpose: the fake judge's
    # answers are a few hundred bytes. model_copy skips validation; the client reads it.
    judge = settings.judge.model_copy(update={"max_response_bytes": max_response_bytes})
    return settings.model_copy(update={"judge": judge})


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A real thread pool that remembers which threads ran the submitted work."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="judge-decode")
        self.threads: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            self.threads.append(threading.current_thread().name)
            return fn(*args, **kwargs)

        return super().submit(run)


@pytest.fixture(scope="module")
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess() as process:
        yield process


@pytest.fixture(scope="module")
def malformed_judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess(None, "--malformed-rate", "1") as process:
        yield process


async def test_an_answer_over_max_response_bytes_fails_like_an_unparseable_one(
    judge: FakeJudgeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="genrm_grpc.judge.client")
    config = _config(judge.url, genrm_parse_retries=2, max_response_bytes=200)
    async with JudgeClient(config, sleep=no_sleep) as client:
        outcome = await client.judge(PLANET)

    # Every attempt spent the budget, then the pass fell back (a completed answer came).
    assert outcome.attempts == 3
    assert outcome.verdict.parse_failed
    kinds = [getattr(r, "judge_failure_kind", None) for r in caplog.records]
    assert kinds.count("oversized") == 2


async def test_an_oversized_answer_then_transport_failures_is_masked() -> None:
    # An oversized answer counts as a completed one, but the judge is gone for the
    # later attempts: the last attempt got no answer, so the comparison fails (masked)
    # rather than falling back to the default verdict (NeMo Gym's rule).
    down: list[FakeJudgeProcess] = []

    with FakeJudgeProcess() as process:
        url = process.url

        async def stop_judge(_seconds: float) -> None:
            if not down:
                await asyncio.to_thread(process.stop)
                down.append(process)

        config = _config(url, genrm_parse_retries=2, max_response_bytes=200)
        async with JudgeClient(config, connect_retries=0, sleep=stop_judge) as client:
            with pytest.raises(JudgeFailedError) as failure:
                await client.judge(PLANET)

    assert "after 3 attempt(s)" in failure.value.reason
    assert "oversized×1" in failure.value.reason
    assert "cannot connect" in failure.value.reason


async def test_large_bodies_are_decoded_and_parsed_in_a_worker_thread(
    judge: FakeJudgeProcess,
) -> None:
    executor = CountingExecutor()
    try:
        async with JudgeClient(_config(judge.url), offload_bytes=100, executor=executor) as client:
            outcome = await client.judge(PLANET)
    finally:
        executor.shutdown()

    assert not outcome.verdict.parse_failed
    assert len(executor.threads) == 1
    assert executor.threads[0].startswith("judge-decode")


async def test_small_bodies_are_decoded_on_the_loop(judge: FakeJudgeProcess) -> None:
    executor = CountingExecutor()
    try:
        async with JudgeClient(
            _config(judge.url), offload_bytes=1 << 20, executor=executor
        ) as client:
            await client.judge(PLANET)
    finally:
        executor.shutdown()

    assert executor.threads == []


async def test_an_unparseable_large_answer_is_parsed_off_the_loop_too(
    malformed_judge: FakeJudgeProcess,
) -> None:
    executor = CountingExecutor()
    try:
        async with JudgeClient(
            _config(malformed_judge.url, genrm_parse_retries=1),
            offload_bytes=100,
            executor=executor,
            sleep=no_sleep,
        ) as client:
            outcome = await client.judge(PLANET)
    finally:
        executor.shutdown()

    assert outcome.verdict.parse_failed
    assert len(executor.threads) == 2


def test_max_response_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_response_bytes"):
        judge_settings("http://127.0.0.1:1", max_response_bytes=0)


async def test_a_chunked_body_without_content_length_is_cut_off_at_the_cap() -> None:
    # The fake judge always sends Content-Length; a judge behind a streaming proxy may
    # not. A raw loopback HTTP/1.1 peer streams an endless chunked body.
    chunk = b"x" * 4096
    served = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        try:
            for _ in range(1000):  # ~4 MiB if nobody stops reading
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            served.set()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        config = _config(
            f"http://127.0.0.1:{port}", genrm_parse_retries=0, max_response_bytes=64 * 1024
        )
        async with JudgeClient(config, sleep=no_sleep) as client:
            outcome = await client.judge(PLANET)
        await asyncio.wait_for(served.wait(), 30)
    finally:
        server.close()
        await server.wait_closed()

    assert outcome.verdict.parse_failed  # oversized counts as a completed answer
    assert outcome.attempts == 1
