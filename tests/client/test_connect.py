"""Connecting: a client says within its connect deadline that nothing answers at an address."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from genrm_cohort_client import (
    ChannelOptions,
    CohortClient,
    CohortConnectError,
    CohortError,
    SyncCohortClient,
)

from genrm_grpc.testing import FakeJudgeServer
from tests.client.support import cohort_server
from tests.client.test_client import ANSWERS, PROMPT, RetryLog


def _refusing_port() -> socket.socket:
    """A port that is bound (so nobody else takes it) but not listening: refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


async def test_nothing_listening_is_a_connect_error_not_a_deadline_and_not_retried() -> None:
    log = RetryLog()
    with _refusing_port() as sock:
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        async with CohortClient(
            target, options=ChannelOptions(connect_timeout_s=1), retry=log.policy()
        ) as client:
            with pytest.raises(CohortConnectError) as caught:
                # The call's own deadline is far away: only the connect deadline may end it.
                await client.compare(PROMPT, ANSWERS, timeout=60)
    error = caught.value
    assert isinstance(error, CohortError) and error.code == grpc.StatusCode.UNAVAILABLE
    prefix = f"UNAVAILABLE CONNECT_FAILED: cannot connect to {target} within 1 s: "
    assert str(error).startswith(prefix)
    assert "Connection refused" in error.cause and error.target == target
    assert (error.reason, error.metadata) == ("CONNECT_FAILED", {"target": target})
    assert error.attempts == 1 and log.codes == []


async def test_concurrent_calls_share_one_connect_attempt_and_all_fail() -> None:
    with _refusing_port() as sock:
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        async with CohortClient(target, options=ChannelOptions(connect_timeout_s=1)) as client:
            outcomes = await asyncio.gather(
                *(client.compare(PROMPT, ANSWERS, timeout=60) for _ in range(6)),
                client.evaluate_group_all(PROMPT, ANSWERS, timeout=60),
                return_exceptions=True,
            )
    assert all(isinstance(o, CohortConnectError) for o in outcomes), outcomes


async def test_without_a_connect_deadline_a_call_waits_for_a_server_that_starts_later(
    fake_judge: FakeJudgeServer,
) -> None:
    sock = _refusing_port()
    port = sock.getsockname()[1]
    options = ChannelOptions(
        connect_timeout_s=None, initial_reconnect_backoff_ms=50, max_reconnect_backoff_ms=100
    )
    async with CohortClient(f"127.0.0.1:{port}", options=options) as client:
        call = asyncio.create_task(client.compare(PROMPT, ANSWERS, timeout=120))
        # The call is waiting once the channel has tried and failed to connect.
        state = client.channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            await client.channel.wait_for_state_change(state)
            state = client.channel.get_state()
        assert not call.done()
        sock.close()
        async with cohort_server(fake_judge.url, port=port):
            reply = await call
    assert len(reply.rewards) == 3


async def test_connect_succeeds_at_once_against_a_running_server(
    fake_judge: FakeJudgeServer,
) -> None:
    async with (
        cohort_server(fake_judge.url) as port,
        CohortClient(f"127.0.0.1:{port}") as client,
    ):
        await client.connect()
        reply = await client.compare(PROMPT, ANSWERS)
    assert len(reply.rewards) == 3


def test_sync_client_reports_the_connect_error_too() -> None:
    with _refusing_port() as sock:
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        with SyncCohortClient(target, options=ChannelOptions(connect_timeout_s=1)) as client:
            with pytest.raises(CohortConnectError, match="cannot connect to"):
                client.connect()
            with pytest.raises(CohortConnectError):
                client.compare(PROMPT, ANSWERS, timeout=60)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan")])
def test_connect_timeout_must_be_positive_and_finite(value: float) -> None:
    with pytest.raises(ValueError, match="connect_timeout_s"):
        ChannelOptions(connect_timeout_s=value)


async def test_after_a_failed_connect_further_calls_fail_at_once_with_that_failure() -> None:
    with _refusing_port() as sock:
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        options = ChannelOptions(connect_timeout_s=1, connect_failure_cache_s=600)
        async with CohortClient(target, options=options) as client:
            with pytest.raises(CohortConnectError) as first:
                await client.compare(PROMPT, ANSWERS, timeout=60)
            with pytest.raises(CohortConnectError) as again:
                await client.compare(PROMPT, ANSWERS, timeout=60)
    assert first.value.failed_s_ago is None
    assert again.value.failed_s_ago is not None and again.value.cause == first.value.cause
    assert "not tried again yet" in str(again.value)
    assert again.value.reason == "CONNECT_FAILED"


async def test_with_no_failure_cache_every_call_tries_to_connect_again() -> None:
    with _refusing_port() as sock:
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        options = ChannelOptions(connect_timeout_s=1, connect_failure_cache_s=0)
        async with CohortClient(target, options=options) as client:
            errors = []
            for _ in range(2):
                with pytest.raises(CohortConnectError) as caught:
                    await client.compare(PROMPT, ANSWERS, timeout=60)
                errors.append(caught.value)
    assert [e.failed_s_ago for e in errors] == [None, None]


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_connect_failure_cache_must_be_non_negative_and_finite(value: float) -> None:
    with pytest.raises(ValueError, match="connect_failure_cache_s"):
        ChannelOptions(connect_failure_cache_s=value)
