"""Fixtures: the real server (grpc.aio on a loopback port) and the fake judge over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError, ErrorDetails, error_info
from genrm_cohort_client.options import RetryPolicy

from genrm_grpc.config import load_settings
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Explain unit testing briefly.")])


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


@pytest.fixture(autouse=True)
def _on_each_store(store_of_kind: str) -> str:
    """Every test here runs on each kind of store (tests/store_kinds.py)."""
    return store_of_kind


Started = tuple[CohortServer, CohortClient]
StartServer = Callable[..., Awaitable[Started]]


@pytest.fixture
async def start_server(fake_judge: FakeJudgeServer) -> AsyncIterator[StartServer]:
    """Start a CohortServer on 127.0.0.1:0 with settings overrides; stopped at teardown."""
    running: list[Started] = []

    async def start(**overrides: Any) -> Started:
        judge = {"url": fake_judge.url, **overrides.pop("judge", {})}
        settings = load_settings(
            listen="127.0.0.1:0",
            judge=judge,
            genrm_parse_retry_sleep_s=0.01,
            shutdown_grace_s=overrides.pop("shutdown_grace_s", 1.0),
            **overrides,
        )
        server = CohortServer(settings)
        port = await server.start()
        # No client-side retries: these tests observe the server's own answers.
        client = CohortClient(f"127.0.0.1:{port}", retry=RetryPolicy(max_attempts=1))
        running.append((server, client))
        return server, client

    yield start
    for server, client in running:
        await client.close()
        if not server.runtime.draining:
            await server.stop()


def member(
    index: int,
    *,
    group: str | None = "g1",
    attempt: int | None = 0,
    size: int | None = 4,
    task_index: int | None = None,
) -> pb.MemberRef:
    ref = pb.MemberRef(rollout_index=index)
    if group is not None:
        ref.group_id = group
    if attempt is not None:
        ref.group_attempt = attempt
    if size is not None:
        ref.group_size = size
    if task_index is not None:
        ref.task_index = task_index
    return ref


ANSWERS = [
    "Unit testing checks small pieces of code in isolation so bugs are caught early.",
    "Testing units.",
    "Unit testing is a way to test each unit of code briefly and explain failures.",
    "",
]


def candidate(index: int, *, variant: str = "") -> pb.Candidate:
    return pb.Candidate(output_text=ANSWERS[index % len(ANSWERS)] + variant)


def rpc_code(exc: grpc.RpcError) -> grpc.StatusCode:
    code: grpc.StatusCode = exc.code()
    return code


#: What a failed call raises: CohortClient wraps errors in CohortError, raw stubs do not.
CALL_ERRORS = (grpc.RpcError, CohortError)


def call_error(exc: BaseException) -> ErrorDetails:
    """Status code, ErrorInfo and field violations of a failed call, however it was made."""
    if isinstance(exc, CohortError):
        return exc.details
    assert isinstance(exc, grpc.RpcError), exc
    return error_info(exc)


class SubmitProbe:
    """Counts submissions reaching the runtime so a test can await "the server has it"."""

    def __init__(self, server: CohortServer) -> None:
        self.count = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []
        runtime = server.runtime
        original = runtime.submit

        async def submit(*args: Any, **kwargs: Any) -> Any:
            ticket = await original(*args, **kwargs)
            self._reached()
            return ticket

        runtime.submit = submit  # type: ignore[method-assign]

    def _reached(self) -> None:
        self.count += 1
        for n, fut in self._waiting:
            if self.count >= n and not fut.done():
                fut.set_result(None)

    async def reached(self, n: int) -> None:
        if self.count >= n:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((n, fut))
        # A bounded wait: a submission that never reaches the runtime fails the test.
        await asyncio.wait_for(fut, 30)
