"""A client that retries says so: warnings, counters, a time limit, a changed server."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import (
    SERVER_OVERLOADED,
    ChannelOptions,
    CohortClient,
    CohortError,
    RetryPolicy,
)
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from genrm_grpc.config import load_settings
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeServer
from tests.client.support import ClientLog
from tests.client.test_client import _Recorder

PROMPT = "2+2?"
FAST = ChannelOptions(initial_reconnect_backoff_ms=50, max_reconnect_backoff_ms=100)


@asynccontextmanager
async def serving(judge_url: str, store: str, port: int = 0) -> AsyncIterator[CohortServer]:
    """A real CohortServer on loopback; stopped (drained) on exit unless it already is."""
    settings = load_settings(
        listen=f"127.0.0.1:{port}",
        judge={"url": judge_url},
        store=store,
        shutdown_grace_s=0.2,
        log_level="WARNING",
    )
    server = CohortServer(settings)
    await server.start()
    try:
        yield server
    finally:
        if not server.runtime.draining:
            await server.stop()


def ref(index: int, group: str = "restart-1") -> dict[str, Any]:
    return {"group_id": group, "group_attempt": 0, "rollout_index": index, "group_size": 2}


async def test_a_member_waiting_on_a_draining_server_warns_counts_and_reattaches_after_restart(
    fake_judge: FakeJudgeServer, tmp_path: Path, client_log: ClientLog
) -> None:
    store = f"sqlite:///{tmp_path / 'state.sqlite3'}"
    policy = RetryPolicy(initial_backoff_s=0.01, jitter_s=0.0, warn_every_s=0.05)
    async with serving(fake_judge.url, store) as first:
        port = first.port
        client = CohortClient(f"127.0.0.1:{port}", options=FAST, retry=policy)
        waiting = asyncio.create_task(client.submit_member(ref(0), PROMPT, "four"))
        await client_log.wait_for("answered by server instance")  # it waits for its cohort
        assert client.stats.server_instance == first.servicer.instance_id
        await first.stop()  # the cohort is kept in the store: UNAVAILABLE / SHUTTING_DOWN

    first_retry = await client_log.wait_for("resending after UNAVAILABLE/SHUTTING_DOWN")
    assert first_retry.levelno == logging.WARNING
    message = first_retry.getMessage()
    assert "SubmitMember group_id='restart-1' group_attempt=0 rollout_index=0" in message
    assert f"to 127.0.0.1:{port}" in message and "retry 1" in message
    assert "gives up after 900 s of retrying" in message
    fields = first_retry.__dict__
    assert fields["code"] == "UNAVAILABLE" and fields["reason"] == "SHUTTING_DOWN"
    assert fields["retries"] == 1 and fields["elapsed_s"] >= 0
    # Nobody answers now: the call keeps waiting, and says so every warn_every_s.
    still = await client_log.wait_for("waiting for the server to come back")
    assert still.levelno == logging.WARNING and "SHUTTING_DOWN" in still.getMessage()
    assert not waiting.done()
    # (A resend that raced the drain meets SHUTTING_DOWN or a transport UNAVAILABLE.)
    assert client.stats.retries_by_reason["UNAVAILABLE/SHUTTING_DOWN"] >= 1
    assert set(client.stats.retries_by_reason) <= {"UNAVAILABLE/SHUTTING_DOWN", "UNAVAILABLE"}
    assert client.stats.retried_calls == 1 and client.stats.gave_up == 0

    async with serving(fake_judge.url, store, port=port) as second:
        other = await client.submit_member(ref(1), PROMPT, "five")
        result = await waiting
    await client.close()
    assert sorted([result.member.rollout_index, other.member.rollout_index]) == [0, 1]
    assert not result.mask_sample and not result.replayed
    # The restarted process is another instance: counted, and a warning (a call waited).
    assert client.stats.server_instance == second.servicer.instance_id
    assert client.stats.server_instance_changes == 1
    changed = client_log.matching("is another process now")
    assert len(changed) == 1 and changed[0].levelno == logging.WARNING
    assert first.servicer.instance_id in changed[0].getMessage()
    assert second.servicer.instance_id in changed[0].getMessage()


async def test_a_call_gives_up_with_the_last_error_after_max_elapsed_s_of_retrying(
    fake_judge: FakeJudgeServer, tmp_path: Path, client_log: ClientLog
) -> None:
    store = f"sqlite:///{tmp_path / 'state.sqlite3'}"
    policy = RetryPolicy(initial_backoff_s=0.01, jitter_s=0.0, max_elapsed_s=0.3, warn_every_s=0.1)
    async with serving(fake_judge.url, store) as server:
        client = CohortClient(f"127.0.0.1:{server.port}", options=FAST, retry=policy)
        waiting = asyncio.create_task(client.submit_member(ref(0), PROMPT, "four"))
        await client_log.wait_for("answered by server instance")
    # Drained and never restarted: the call retries for 0.3 s, then raises.
    with pytest.raises(CohortError) as caught:
        await waiting
    await client.close()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert caught.value.reason == "SHUTTING_DOWN"
    assert client.stats.gave_up == 1
    gave_up = client_log.matching("giving up after")
    assert len(gave_up) == 1 and gave_up[0].__dict__["retrying_s"] >= 0.3
    assert "rollout_index=0" in gave_up[0].getMessage()


async def test_a_different_server_on_the_same_port_under_a_retrying_call_is_a_warning(
    fake_judge: FakeJudgeServer, tmp_path: Path, client_log: ClientLog
) -> None:
    policy = RetryPolicy(initial_backoff_s=0.01, jitter_s=0.0, warn_every_s=60)
    async with serving(fake_judge.url, f"sqlite:///{tmp_path / 'a.sqlite3'}") as first:
        port, was = first.port, first.servicer.instance_id
        client = CohortClient(f"127.0.0.1:{port}", options=FAST, retry=policy)
        waiting = asyncio.create_task(client.submit_member(ref(0, "lost"), PROMPT, "four"))
        await client_log.wait_for("answered by server instance")
    await client_log.wait_for("resending after")
    # An unrelated server (its own store) takes the port: the member starts a new cohort
    # there and would wait for a partner that never comes; the client says so.
    async with serving(fake_judge.url, "memory://", port=port) as stranger:
        changed = await client_log.wait_for("is another process now")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await client.close()
    assert changed.levelno == logging.WARNING
    assert changed.__dict__["previous_server_instance"] == was
    assert changed.__dict__["server_instance"] == stranger.servicer.instance_id
    assert changed.__dict__["retrying_calls"] == 1
    assert "SubmitMember group_id='lost'" in changed.getMessage()
    assert client.stats.server_instance_changes == 1
    # warn_every_s=60: one warning for the first retry, however many retries followed.
    assert len(client_log.matching("resending after")) == 1


async def test_calls_answered_at_once_name_their_server_through_the_trailers(
    fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    """A 1-member cohort and a refusal are answered without waiting, so the server sends
    no separate initial metadata; the client still learns (and counts) who answered."""
    async with serving(fake_judge.url, f"sqlite:///{tmp_path / 'a.sqlite3'}") as first:
        port = first.port
        client = CohortClient(f"127.0.0.1:{port}", options=FAST)
        alone = {"group_id": "alone", "group_attempt": 0, "rollout_index": 0, "group_size": 1}
        await client.submit_member(alone, PROMPT, "four")
        assert client.stats.server_instance == first.servicer.instance_id
    async with serving(fake_judge.url, "memory://", port=port) as second:
        with pytest.raises(CohortError):  # refused: a blank group id
            await client.submit_member({**alone, "group_id": " "}, PROMPT, "four")
        assert client.stats.server_instance == second.servicer.instance_id
        assert client.stats.server_instance_changes == 1
        await client.close()


def _overloaded(code: grpc.StatusCode) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=SERVER_OVERLOADED, domain="cohort.genrm.v1")
    detail = any_pb2.Any()
    detail.Pack(info)
    number = (
        code_pb2.UNAVAILABLE if code == grpc.StatusCode.UNAVAILABLE else code_pb2.RESOURCE_EXHAUSTED
    )
    status = status_pb2.Status(code=number, message="too many calls", details=[detail])
    return rpc_status.to_status(status)


class _Overloaded(_Recorder):
    """Refuses its first calls as an overloaded server does, then answers."""

    def __init__(self, refusals: list[grpc.StatusCode]) -> None:
        super().__init__()
        self.refusals = list(refusals)
        self.calls = 0

    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Any
    ) -> pb.SubmitMemberResponse:
        self.calls += 1
        if self.refusals:
            await context.abort_with_status(_overloaded(self.refusals.pop(0)))
        return await super().SubmitMember(request, context)


async def _through_refusals(
    refusals: list[grpc.StatusCode], **policy: Any
) -> tuple[pb.MemberResult, _Overloaded, CohortClient, list[float]]:
    """One member sent to a server that refuses its first ``refusals`` calls, under a
    ``RetryPolicy(**policy)``: its result, the server, the (closed) client and the waits
    between its calls."""
    servicer = _Overloaded(refusals)
    server = grpc.aio.server()
    pb_grpc.add_CohortServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sleeps: list[float] = []
    retry = RetryPolicy(**policy, on_retry=lambda exc, calls, sleep: sleeps.append(sleep))
    try:
        async with CohortClient(f"127.0.0.1:{port}", retry=retry) as client:
            result = await client.submit_member(ref(0), PROMPT, "four")
    finally:
        await server.stop(None)
    return result, servicer, client, sleeps


async def test_server_overloaded_is_resent_with_backoff_and_counted_per_reason(
    client_log: ClientLog,
) -> None:
    refusals = [grpc.StatusCode.UNAVAILABLE] * 4 + [grpc.StatusCode.RESOURCE_EXHAUSTED]
    result, servicer, client, sleeps = await _through_refusals(
        refusals, initial_backoff_s=0.001, max_backoff_s=0.004, jitter_s=0.0
    )
    assert result.reward == 0.5 and servicer.calls == 6
    assert sleeps == [0.001, 0.002, 0.004, 0.004, 0.004]  # exponential, capped
    assert client.stats.retries == 5
    assert client.stats.retries_by_reason == {
        "UNAVAILABLE/SERVER_OVERLOADED": 4,
        "RESOURCE_EXHAUSTED/SERVER_OVERLOADED": 1,
    }
    assert len(client_log.matching("resending after UNAVAILABLE/SERVER_OVERLOADED")) == 1


async def test_retry_jitter_leaves_the_callers_seeded_random_sequence_alone() -> None:
    # A trainer seeds ``random`` for a reproducible run; a retried call must not shift it.
    before = random.getstate()
    _, _, _, sleeps = await _through_refusals(
        [grpc.StatusCode.UNAVAILABLE] * 3,
        initial_backoff_s=0.001,
        max_backoff_s=0.001,
        jitter_s=0.002,
    )
    assert len(sleeps) == 3 and len(set(sleeps)) == 3  # jittered: three different waits
    assert random.getstate() == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_elapsed_s", 0.0), ("max_elapsed_s", float("inf")), ("warn_every_s", 0.0)],
)
def test_retry_time_limits_must_be_positive_and_finite(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{field: value})


def test_the_default_policy_gives_up_after_900_s_and_warns_every_minute() -> None:
    policy = RetryPolicy()
    assert policy.max_elapsed_s == 900.0 and policy.warn_every_s == 60.0
    assert RetryPolicy(max_elapsed_s=None).max_elapsed_s is None
