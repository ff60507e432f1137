"""CohortClient against a real CohortServer over loopback gRPC and the fake judge over HTTP."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import (
    NEVER_RETRY,
    ChannelOptions,
    CohortClient,
    CohortError,
    RetryPolicy,
    SyncCohortClient,
    new_group_id,
    uuid7,
)

from genrm_grpc.testing import FakeJudgeServer
from tests.client.support import cohort_server

PROMPT = "Explain unit testing briefly."
ANSWERS = [
    "Unit testing checks small pieces of code in isolation so bugs are caught early.",
    "Testing units.",
    "Unit testing is a way to test each unit of code briefly and explain failures.",
]
FAST_RECONNECT = ChannelOptions(
    wait_for_ready=False, initial_reconnect_backoff_ms=50, max_reconnect_backoff_ms=100
)


class RetryLog:
    """A RetryPolicy hook that records every retry and wakes a waiting test."""

    def __init__(self) -> None:
        self.codes: list[grpc.StatusCode] = []
        self.event = asyncio.Event()

    def __call__(self, exc: Exception, calls: int, sleep_s: float) -> None:
        assert isinstance(exc, CohortError)
        self.codes.append(exc.code)
        self.event.set()

    def policy(self, **kwargs: Any) -> RetryPolicy:
        defaults: dict[str, Any] = {
            "max_attempts": 400,
            "initial_backoff_s": 0.01,
            "max_backoff_s": 0.05,
            "jitter_s": 0.01,
            "max_elapsed_s": 20.0,
        }
        return RetryPolicy(on_retry=self, **{**defaults, **kwargs})


def test_minted_group_ids_are_uuid7_unique_and_time_ordered() -> None:
    ids = [uuid7() for _ in range(2000)]
    assert ids == sorted(ids, key=lambda u: u.int)
    assert len(set(ids)) == len(ids)
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert uuid7(now_ms=1_000).int < uuid7(now_ms=2_000).int
    assert new_group_id("run-").startswith("run-")


async def test_evaluate_group_yields_every_result_and_a_resubmission_replays(
    fake_judge: FakeJudgeServer,
) -> None:
    async with (
        cohort_server(fake_judge.url) as port,
        CohortClient(f"127.0.0.1:{port}") as client,
    ):
        events: list[str] = []
        results = [
            r
            async for r in client.evaluate_group(
                PROMPT, ANSWERS, on_event=lambda e: events.append(e.WhichOneof("event"))
            )
        ]
        group_id = results[0].member.group_id
        assert uuid.UUID(group_id).version == 7
        assert sorted(r.member.rollout_index for r in results) == [0, 1, 2]
        assert {r.member.group_attempt for r in results} == {0}
        assert not any(r.mask_sample or r.replayed for r in results)
        assert events.count("accepted") == 3 and "pair_judged" in events
        judged = fake_judge.stats()["total"]
        assert judged == 3  # circular: 3 pairs

        again = await client.evaluate_group_all(PROMPT, ANSWERS, group_id=group_id)
        assert [r.reward for r in again] == [
            r.reward for r in sorted(results, key=lambda r: r.member.rollout_index)
        ]
        assert all(r.replayed for r in again)
        assert fake_judge.stats()["total"] == judged
        assert client.attempts.latest(group_id) == 0


async def test_unavailable_is_retried_until_the_server_restarts_on_the_same_port(
    fake_judge: FakeJudgeServer,
) -> None:
    log = RetryLog()
    async with cohort_server(fake_judge.url) as port:
        client = CohortClient(f"127.0.0.1:{port}", options=FAST_RECONNECT, retry=log.policy())
        first = await client.evaluate_group_all(PROMPT, ANSWERS)
        assert len(first) == 3 and log.codes == []
    # The server is gone: the next group meets UNAVAILABLE and keeps retrying.
    task = asyncio.create_task(client.evaluate_group_all(PROMPT, ANSWERS, group_id="restart"))
    await log.event.wait()
    assert not task.done()
    async with cohort_server(fake_judge.url, port=port):
        results = await task
    await client.close()
    assert log.codes and set(log.codes) == {grpc.StatusCode.UNAVAILABLE}
    assert [r.member.group_id for r in results] == ["restart"] * 3
    assert not any(r.mask_sample for r in results)
    assert fake_judge.stats()["total"] == 6  # the retried group was judged exactly once


async def test_unavailable_retries_give_up_after_max_attempts(
    fake_judge: FakeJudgeServer,
) -> None:
    log = RetryLog()
    async with cohort_server(fake_judge.url) as port:
        client = CohortClient(
            f"127.0.0.1:{port}", options=FAST_RECONNECT, retry=log.policy(max_attempts=3)
        )
        await client.connect()
    # Connected once, then the server went away: UNAVAILABLE is retried, then given up.
    # (A server that never answered is a CohortConnectError instead: tests/client/test_connect.py.)
    async with client:
        with pytest.raises(CohortError) as caught:
            await client.compare(PROMPT, ANSWERS)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert caught.value.attempts == 3 and len(log.codes) == 2


async def test_aborted_group_is_replaced_as_the_next_attempt_when_the_caller_regenerates(
    fake_judge: FakeJudgeServer,
) -> None:
    regenerated: list[int] = []

    async def regenerate(attempt: int) -> list[str]:
        regenerated.append(attempt)
        return ANSWERS  # a whole replacement group: every slot

    async with (
        cohort_server(fake_judge.url, cohort_collection_timeout_s=0.3) as port,
        CohortClient(f"127.0.0.1:{port}") as client,
    ):
        # Only two of three members: attempt 0 can never complete; its deadline aborts it.
        results = await client.evaluate_group_all(
            PROMPT,
            ANSWERS[:2],
            group_id="partial",
            group_size=3,
            max_group_attempts=2,
            regenerate=regenerate,
        )
        old = await client.get_cohort("partial", attempt=0)
        new = await client.get_cohort("partial")
    assert regenerated == [1]
    assert [(r.member.group_attempt, r.member.rollout_index) for r in results] == [
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert old.phase == pb.COHORT_PHASE_FAILED
    assert new.phase == pb.COHORT_PHASE_COMPLETED and new.latest_attempt == 1
    assert client.attempts.latest("partial") == 1


@pytest.mark.parametrize(
    ("opt_in", "expected_attempt"),
    [({}, 0), ({"reuse_answers_on_abort": True, "max_group_attempts": 2}, 1)],
    ids=["not-opted-in", "reused-answers-fail-again"],
)
async def test_aborted_group_surfaces_as_cohort_error_with_reason_and_metadata(
    fake_judge: FakeJudgeServer, opt_in: dict[str, Any], expected_attempt: int
) -> None:
    async with (
        cohort_server(fake_judge.url, cohort_collection_timeout_s=0.3) as port,
        CohortClient(f"127.0.0.1:{port}") as client,
    ):
        with pytest.raises(CohortError) as caught:
            await client.evaluate_group_all(
                PROMPT, ANSWERS[:2], group_id="never-full", group_size=3, **opt_in
            )
    err = caught.value
    assert err.code == grpc.StatusCode.ABORTED and err.reason == "COHORT_FAILED"
    assert err.metadata["groupId"] == "never-full"
    assert err.group_attempt == expected_attempt
    assert err.metadata["groupAttempt"] == str(expected_attempt)
    assert fake_judge.stats()["total"] == 0


async def test_non_retryable_errors_surface_at_once_as_cohort_error(
    fake_judge: FakeJudgeServer,
) -> None:
    log = RetryLog()
    async with (
        cohort_server(fake_judge.url) as port,
        CohortClient(f"127.0.0.1:{port}", retry=log.policy()) as client,
    ):
        await client.evaluate_group_all(PROMPT, ANSWERS[:2], group_id="done")
        cases = [
            (pb.MemberRef(group_id="done", group_attempt=0, rollout_index=0, group_size=2),
             PROMPT, "a different answer", "SLOT_CONFLICT"),
            (pb.MemberRef(group_id="bad", group_attempt=0, rollout_index=5, group_size=2),
             PROMPT, "x", "INVALID_MEMBER"),
            (pb.MemberRef(group_id="done", group_attempt=0, rollout_index=0, group_size=2),
             "Another prompt entirely.", ANSWERS[0], "PROMPT_MISMATCH"),
        ]  # fmt: skip
        errors = []
        for ref, prompt, answer, _ in cases:
            with pytest.raises(CohortError) as caught:
                await client.submit_member(ref, prompt, answer)
            errors.append(caught.value)
        with pytest.raises(CohortError) as streamed:
            await client.evaluate_group_all(PROMPT, ["other", "answers"], group_id="done")
    assert [e.reason for e in errors] == [c[3] for c in cases]
    assert [e.code for e in errors] == [
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
    ]
    assert all(e.code in NEVER_RETRY and e.attempts == 1 for e in errors)
    assert errors[1].field_violations
    assert streamed.value.reason == "SLOT_CONFLICT" and streamed.value.attempts == 1
    assert log.codes == []


async def test_sync_client_evaluates_a_group_from_a_plain_thread(
    fake_judge: FakeJudgeServer,
) -> None:
    async with cohort_server(fake_judge.url) as port:

        def blocking() -> tuple[list[int], pb.CohortInfo]:
            with SyncCohortClient(f"127.0.0.1:{port}") as client:
                seen = [
                    r.member.rollout_index
                    for r in client.evaluate_group(PROMPT, ANSWERS, group_id="sync")
                ]
                return seen, client.get_cohort("sync")

        seen, info = await asyncio.to_thread(blocking)
    assert sorted(seen) == [0, 1, 2]
    assert info.phase == pb.COHORT_PHASE_COMPLETED


class _Recorder(pb_grpc.CohortServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.metadata: dict[str, str] = {}
        self.request: pb.CompareRequest | None = None

    async def Compare(self, request: pb.CompareRequest, context: Any) -> pb.CompareResponse:
        self.metadata = {k: v for k, v in context.invocation_metadata()}
        self.request = request
        return pb.CompareResponse(rewards=[1.0] * len(request.candidates))

    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Any
    ) -> pb.SubmitMemberResponse:
        self.metadata = {k: v for k, v in context.invocation_metadata()}
        return pb.SubmitMemberResponse(result=pb.MemberResult(member=request.member, reward=0.5))


async def test_submit_member_names_its_group_in_metadata_for_group_affine_balancers() -> None:
    recorder = _Recorder()
    server = grpc.aio.server()
    pb_grpc.add_CohortServiceServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with CohortClient(f"127.0.0.1:{port}") as client:
            await client.submit_member(
                {"group_id": "job-1/p-3", "group_attempt": 0, "rollout_index": 1, "group_size": 2},
                "2+2?",
                "four",
            )
            grouped = dict(recorder.metadata)
            await client.submit_member(
                {"task_index": 3, "rollout_index": 1, "group_size": 2}, "2+2?", "four"
            )
            legacy = dict(recorder.metadata)
    finally:
        await server.stop(None)
    assert grouped["x-genrm-group-id"] == "job-1/p-3"
    assert "x-genrm-group-id" not in legacy


async def test_bearer_token_user_agent_and_candidate_forms_reach_the_server() -> None:
    recorder = _Recorder()
    server = grpc.aio.server()
    pb_grpc.add_CohortServiceServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    response_obj = {
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "4"}]}]
    }
    try:
        async with CohortClient(
            f"127.0.0.1:{port}", options=ChannelOptions(bearer_token="s3cret")
        ) as client:
            reply = await client.compare(
                [("system", "Be brief."), ("user", "2+2?")], ["four", response_obj]
            )
    finally:
        await server.stop(None)
    assert list(reply.rewards) == [1.0, 1.0]
    assert recorder.metadata["authorization"] == "Bearer s3cret"
    assert "genrm-cohort-client" in recorder.metadata["user-agent"]
    assert recorder.request is not None
    assert [m.role for m in recorder.request.prompt.messages] == ["system", "user"]
    first, second = recorder.request.candidates
    assert first.output_text == "four" and not first.responses_api_json
    assert json.loads(second.responses_api_json) == response_obj


def test_channel_options_match_the_server_keepalive_policy_and_limits() -> None:
    options = dict(ChannelOptions(max_receive_message_bytes=1 << 20).grpc_options())
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.keepalive_timeout_ms"] == 10_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert options["grpc.max_send_message_length"] == 16 * 1024 * 1024
    assert options["grpc.max_receive_message_length"] == 1 << 20
    assert ChannelOptions(root_certificates=b"pem").secure
    assert not ChannelOptions().secure
    with pytest.raises(ValueError, match="mutual TLS"):
        ChannelOptions(client_cert_chain=b"cert")


class _CancelsFirst(_Recorder):
    """Answers its first ``refusals`` SubmitMember calls CANCELLED without ErrorInfo, as
    grpc-core does for a call beyond its pending queue; then answers normally."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.calls = 0

    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Any
    ) -> pb.SubmitMemberResponse:
        self.calls += 1
        if self.calls <= self.refusals:
            await context.abort(grpc.StatusCode.CANCELLED, "refused: pending queue full")
        return await super().SubmitMember(request, context)


async def test_a_member_the_server_side_cancelled_is_resent_and_gets_its_reward() -> None:
    servicer = _CancelsFirst(refusals=2)
    server = grpc.aio.server()
    pb_grpc.add_CohortServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    policy = RetryPolicy(initial_backoff_s=0.0, jitter_s=0.0)
    try:
        async with CohortClient(f"127.0.0.1:{port}", retry=policy) as client:
            result = await client.submit_member(
                {"group_id": "burst", "group_attempt": 0, "rollout_index": 0, "group_size": 2},
                "2+2?",
                "four",
            )
    finally:
        await server.stop(None)
    assert result.reward == 0.5
    assert servicer.calls == 3
    assert client.stats.retries_by_reason == {"CANCELLED": 2}


class _Holds(_Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.arrived = asyncio.Event()

    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Any
    ) -> pb.SubmitMemberResponse:
        self.calls += 1
        self.arrived.set()
        await asyncio.Event().wait()  # until the call is cancelled
        raise AssertionError("unreachable")


async def test_a_call_the_caller_cancels_or_the_client_closes_is_not_resent() -> None:
    servicer = _Holds()
    server = grpc.aio.server()
    pb_grpc.add_CohortServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ref = {"group_id": "held", "group_attempt": 0, "rollout_index": 0, "group_size": 2}
    policy = RetryPolicy(initial_backoff_s=0.0, jitter_s=0.0)
    try:
        client = CohortClient(f"127.0.0.1:{port}", retry=policy)
        call = asyncio.create_task(client.submit_member(ref, "2+2?", "four"))
        await servicer.arrived.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert servicer.calls == 1

        servicer.arrived.clear()
        call = asyncio.create_task(client.submit_member(ref, "2+2?", "four"))
        await servicer.arrived.wait()
        await client.close()
        with pytest.raises((asyncio.CancelledError, CohortError)):
            await call
        assert servicer.calls == 2
        assert client.stats.retries == 0
    finally:
        await server.stop(None)


async def test_a_set_of_status_codes_passed_as_retry_is_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match=r"retry= takes a RetryPolicy or None, not frozenset"):
        CohortClient("127.0.0.1:1", retry=NEVER_RETRY)  # type: ignore[arg-type]
    async with CohortClient("127.0.0.1:1") as client:
        ref = {"group_id": "g", "group_attempt": 0, "rollout_index": 0, "group_size": 2}
        with pytest.raises(TypeError, match=r"RetryPolicy\(max_attempts=1\)"):
            await client.submit_member(ref, "2+2?", "four", retry=NEVER_RETRY)  # type: ignore[arg-type]
