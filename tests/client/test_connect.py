"""Connecting: a client says within its connect deadline that nothing answers at an address."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from genrm_cohort_client import (
    CONNECT_FAILED,
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


async def test_nothing_listening_is_a_connect_failed_error_naming_the_target_not_retried() -> None:
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
    assert error.reason == CONNECT_FAILED and error.metadata == {"target": target}
    assert str(error).startswith(
        f"UNAVAILABLE CONNECT_FAILED: cannot connect to {target} within 1 s: "
    )
    assert "Connection refused" in error.cause and error.target == target
    assert error.attempts == 1 and log.codes == [] and error.age_s is None
    assert client.stats.connect_failures == 1 and client.stats.retries == 0


async def test_a_second_call_to_a_dead_address_fails_at_once_with_the_remembered_error() -> None:
    with _refusing_port() as sock:
        target = f"127.0.0.1:{sock.getsockname()[1]}"
        options = ChannelOptions(connect_timeout_s=1, connect_failure_ttl_s=30)
        async with CohortClient(target, options=options) as client:
            clock = [0.0]
            client._clock = lambda: clock[0]
            with pytest.raises(CohortConnectError):
                await client.compare(PROMPT, ANSWERS, timeout=60)  # waits its 1 s
            clock[0] = 12.0
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(CohortConnectError) as caught:
                await client.submit_member(
                    {"group_id": "g", "group_attempt": 0, "rollout_index": 0, "group_size": 2},
                    PROMPT,
                    ANSWERS[0],
                    timeout=60,
                )
            # No second wait of connect_timeout_s: the same failure, said to be remembered.
            assert loop.time() - began < 0.5
            again = caught.value
            assert again.reason == CONNECT_FAILED and again.age_s == 12.0
            assert "(remembered: the attempt failed 12.0 s ago)" in str(again)
            assert client.stats.connect_failures == 1
            assert client.stats.connect_failures_cached == 1

            # Past connect_failure_ttl_s the next call tries (and waits) again.
            clock[0] = 31.0
            with pytest.raises(CohortConnectError) as caught:
                await client.compare(PROMPT, ANSWERS, timeout=60)
            assert caught.value.age_s is None and client.stats.connect_failures == 2
            # An explicit connect timeout always makes a new attempt.
            with pytest.raises(CohortConnectError) as caught:
                await client.connect(timeout=0.2)
            assert caught.value.age_s is None and client.stats.connect_failures == 3


async def test_a_remembered_connect_failure_does_not_hide_a_server_that_started_since(
    fake_judge: FakeJudgeServer,
) -> None:
    sock = _refusing_port()
    port = sock.getsockname()[1]
    options = ChannelOptions(
        connect_timeout_s=0.5,
        connect_failure_ttl_s=5,
        initial_reconnect_backoff_ms=50,
        max_reconnect_backoff_ms=100,
    )
    async with CohortClient(f"127.0.0.1:{port}", options=options) as client:
        clock = [0.0]
        client._clock = lambda: clock[0]
        with pytest.raises(CohortConnectError):
            await client.connect()
        sock.close()
        async with cohort_server(fake_judge.url, port=port):
            with pytest.raises(CohortConnectError):
                await client.compare(PROMPT, ANSWERS)  # within the ttl: remembered
            clock[0] = 5.0
            reply = await client.compare(PROMPT, ANSWERS)
    assert len(reply.rewards) == 3


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


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_connect_failure_ttl_must_be_non_negative_and_finite(value: float) -> None:
    with pytest.raises(ValueError, match="connect_failure_ttl_s"):
        ChannelOptions(connect_failure_ttl_s=value)
