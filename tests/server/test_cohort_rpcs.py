"""SubmitMember, StreamGroups and GetCohort over real gRPC against the fake judge over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, status_error_info

from genrm_grpc.testing import FakeJudgeServer
from tests.docs.stop_statement import documented_waiter_reason

from .conftest import CALL_ERRORS, PROMPT, StartServer, SubmitProbe, call_error, candidate, member


async def _submit_group(
    client: CohortClient, *, group: str = "g1", attempt: int = 0, size: int = 4
) -> list[pb.MemberResult]:
    calls = [
        client.submit_member(
            member(k, group=group, attempt=attempt, size=size), PROMPT, candidate(k), timeout=30
        )
        for k in range(size)
    ]
    return list(await asyncio.gather(*calls))


async def test_a_whole_group_is_rewarded_together_with_one_judge_call_per_pair(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    _, client = await start_server()
    results = await _submit_group(client)
    assert [r.member.rollout_index for r in results] == [0, 1, 2, 3]
    assert not any(r.replayed or r.mask_sample for r in results)
    assert fake_judge.stats()["total"] == 4  # circular, N = 4, one judge
    assert all(len(r.comparisons) == 2 for r in results)
    assert results[0].group_metrics == results[3].group_metrics


async def test_identical_resubmit_after_completion_replays_without_judging(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    _, client = await start_server()
    first = await _submit_group(client)
    again = await client.submit_member(member(2), PROMPT, candidate(2), timeout=10)
    assert again.replayed
    assert again.reward == first[2].reward
    assert fake_judge.stats()["total"] == 4


async def test_a_different_response_for_a_filled_slot_is_slot_conflict(
    start_server: StartServer,
) -> None:
    _, client = await start_server()
    await _submit_group(client)
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(member(1), PROMPT, candidate(1, variant="!"), timeout=10)
    info = call_error(caught.value)
    assert (info.code, info.reason) == (grpc.StatusCode.ALREADY_EXISTS, "SLOT_CONFLICT")
    assert info.metadata == {"groupId": "g1", "groupAttempt": "0", "rolloutIndex": "1"}


async def test_a_newer_attempt_aborts_the_older_ones_waiters_and_fences_them(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server, client = await start_server()
    probe = SubmitProbe(server)
    old = asyncio.create_task(client.submit_member(member(0), PROMPT, candidate(0), timeout=30))
    await probe.reached(1)  # attempt 0 exists before attempt 1 arrives
    new_results = await _submit_group(client, attempt=1)
    with pytest.raises(CALL_ERRORS) as caught:
        await old
    info = call_error(caught.value)
    assert (info.code, info.reason) == (grpc.StatusCode.ABORTED, "COHORT_FAILED")
    assert "superseded by attempt 1" in info.message
    with pytest.raises(CALL_ERRORS) as late:
        await client.submit_member(member(1), PROMPT, candidate(1), timeout=10)
    late_info = call_error(late.value)
    assert late_info.reason == "ATTEMPT_SUPERSEDED"
    assert late_info.metadata["latestAttempt"] == "1"
    assert len(new_results) == 4
    assert fake_judge.stats()["total"] == 4


async def test_judge_failure_masks_every_member_instead_of_fabricating_rewards(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_503_rate=1.0)
    _, client = await start_server(genrm_parse_retries=1)
    results = await _submit_group(client)
    for r in results:
        assert r.mask_sample
        assert r.failure_kind == pb.FAILURE_KIND_JUDGE_FAILED
        assert r.reward == 0.0
        assert "503" in r.failure_reason and len(r.failure_reason) <= 2000
    replay = await client.submit_member(member(0), PROMPT, candidate(0), timeout=10)
    assert replay.replayed and replay.mask_sample


async def test_an_expired_client_deadline_leaves_the_member_and_a_retry_reattaches(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server, client = await start_server()
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(member(0), PROMPT, candidate(0), timeout=0.2)
    assert call_error(caught.value).code == grpc.StatusCode.DEADLINE_EXCEEDED
    info = await client.get_cohort(member(0), timeout=5)
    assert list(info.present_indices) == [0]
    assert server.runtime.stats()["waiters"] == 0
    results = await _submit_group(client)  # slot 0 is an identical retry: it reattaches
    assert len(results) == 4
    assert fake_judge.stats()["total"] == 4


async def test_collection_deadline_fails_a_partial_group_with_aborted(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    _, client = await start_server(cohort_collection_timeout_s=0.3)
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(member(0), PROMPT, candidate(0), timeout=10)
    info = call_error(caught.value)
    assert (info.code, info.reason) == (grpc.StatusCode.ABORTED, "COHORT_FAILED")
    assert "collection deadline" in info.message and "1/4" in info.message
    cohort = await client.get_cohort(member(0), timeout=5)
    assert cohort.phase == pb.COHORT_PHASE_FAILED
    assert fake_judge.stats()["total"] == 0


async def test_legacy_group_failure_tells_the_client_to_use_a_fresh_group_id(
    start_server: StartServer,
) -> None:
    _, client = await start_server(cohort_collection_timeout_s=0.3)
    legacy = member(0, group=None, attempt=None, task_index=7)
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(legacy, PROMPT, candidate(0), timeout=10)
    assert "fresh group_id" in call_error(caught.value).message


async def test_bad_coordinates_are_invalid_argument_with_field_violations(
    start_server: StartServer,
) -> None:
    _, client = await start_server()
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(member(4, size=4), PROMPT, candidate(0), timeout=10)
    info = call_error(caught.value)
    assert (info.code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMBER")
    assert info.field_violations[0][0] == "member.rollout_index"


async def test_too_many_active_cohorts_is_resource_exhausted(start_server: StartServer) -> None:
    server, client = await start_server(max_active_cohorts=1)
    probe = SubmitProbe(server)
    first = asyncio.create_task(client.submit_member(member(0), PROMPT, candidate(0), timeout=30))
    await probe.reached(1)
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(member(0, group="g2"), PROMPT, candidate(0), timeout=10)
    info = call_error(caught.value)
    assert (info.code, info.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "CAPACITY_EXHAUSTED")
    first.cancel()


async def test_an_oversized_member_is_resource_exhausted_with_error_info(
    start_server: StartServer,
) -> None:
    _, client = await start_server(max_message_bytes=4096)
    big = pb.Candidate(output_text="x" * 5000)
    with pytest.raises(CALL_ERRORS) as caught:
        await client.submit_member(member(0), PROMPT, big, timeout=10)
    assert call_error(caught.value).reason == "CAPACITY_EXHAUSTED"


async def test_get_cohort_reports_phase_and_missing_slots_and_not_found(
    start_server: StartServer,
) -> None:
    server, client = await start_server()
    probe = SubmitProbe(server)
    pending = asyncio.create_task(client.submit_member(member(2), PROMPT, candidate(2), timeout=30))
    await probe.reached(1)
    info = await client.get_cohort(pb.MemberRef(group_id="g1"), timeout=5)
    assert info.phase == pb.COHORT_PHASE_COLLECTING
    assert list(info.present_indices) == [2]
    assert info.group_size == 4
    assert 0 < info.seconds_to_deadline <= 1800
    with pytest.raises(CALL_ERRORS) as caught:
        await client.get_cohort(pb.MemberRef(group_id="nope"), timeout=5)
    missing = call_error(caught.value)
    assert missing.code == grpc.StatusCode.NOT_FOUND
    assert missing.reason == "COHORT_NOT_FOUND"
    assert missing.metadata == {"groupId": "nope", "groupAttempt": "0"}
    pending.cancel()


# Nothing outlives a memory:// process: the cohort fails for good. A file keeps the
# cohort for the next process, a shared Redis for the other replicas: the call is only
# interrupted (docs/durability.md's stop table, quoted).
STOP_WORDS = {
    "memory": "shutting down",
    "sqlite": "kept in its store",
    "redis": "goes on in the shared store",
}


async def test_shutdown_refuses_new_cohorts_and_ends_waiting_calls_as_the_stop_page_says(
    start_server: StartServer, store_kind: str
) -> None:
    # The expected reason is the one docs/durability.md states for this store.
    reason = documented_waiter_reason(store_kind)
    words = STOP_WORDS[store_kind]
    server, client = await start_server(shutdown_grace_s=0.5)
    probe = SubmitProbe(server)
    waiting = asyncio.create_task(client.submit_member(member(0), PROMPT, candidate(0), timeout=30))
    await probe.reached(1)
    server.runtime.start_draining()
    with pytest.raises(CALL_ERRORS) as refused:
        await client.submit_member(member(0, group="g9"), PROMPT, candidate(0), timeout=10)
    assert call_error(refused.value).reason == "SHUTTING_DOWN"
    assert call_error(refused.value).code == grpc.StatusCode.UNAVAILABLE
    stop = asyncio.create_task(server.stop())
    with pytest.raises(CALL_ERRORS) as caught:
        await waiting
    info = call_error(caught.value)
    assert info.reason == reason and words in info.message
    await stop
    assert server.runtime.stats()["owned_tasks"] == 0


async def _members(
    *, group: str = "s1", size: int = 4, extra: list[pb.SubmitMemberRequest] | None = None
) -> AsyncIterator[pb.SubmitMemberRequest]:
    for k in range(size):
        yield pb.SubmitMemberRequest(
            member=member(k, group=group, size=size), prompt=PROMPT, candidate=candidate(k)
        )
    for request in extra or []:
        yield request


async def test_stream_groups_accepts_reports_progress_and_ends_ok_after_every_result(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    _, client = await start_server()
    events = [e async for e in client.stream_groups(_members(), timeout=30)]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("accepted") == 4
    assert kinds.count("pair_judged") == 4
    assert kinds.count("result") == 4
    # Results come after every pair was judged: published together.
    assert max(i for i, k in enumerate(kinds) if k == "pair_judged") < kinds.index("result")
    rewards = {
        e.result.member.rollout_index: e.result.reward for e in events if e.result.member.group_id
    }
    assert sorted(rewards) == [0, 1, 2, 3]
    assert fake_judge.stats()["total"] == 4


async def test_stream_groups_reports_a_per_member_error_and_keeps_going(
    start_server: StartServer,
) -> None:
    _, client = await start_server()
    bad = pb.SubmitMemberRequest(
        member=member(9, group="s1"), prompt=PROMPT, candidate=candidate(0)
    )
    conflict = pb.SubmitMemberRequest(
        member=member(1, group="s1"), prompt=PROMPT, candidate=candidate(1, variant="?")
    )
    events = [e async for e in client.stream_groups(_members(extra=[bad, conflict]), timeout=30)]
    errors = [status_error_info(e.error.status) for e in events if e.WhichOneof("event") == "error"]
    assert sorted(e.reason for e in errors) == ["INVALID_MEMBER", "SLOT_CONFLICT"]
    assert sum(1 for e in events if e.WhichOneof("event") == "result") == 4


async def test_a_broken_stream_drops_only_its_waiters_and_members_stay(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    server, client = await start_server()
    call = client.stub.StreamGroups(
        pb.StreamGroupsRequest(member=r)
        async for r in _members(size=4)
        if r.member.rollout_index < 2
    )
    accepted = 0
    async for event in call:
        accepted += event.WhichOneof("event") == "accepted"
        if accepted == 2:
            break
    call.cancel()
    info = await client.get_cohort(pb.MemberRef(group_id="s1"), timeout=5)
    assert list(info.present_indices) == [0, 1]
    events = [e async for e in client.stream_groups(_members(), timeout=30)]
    assert sum(1 for e in events if e.WhichOneof("event") == "result") == 4
    assert server.runtime.stats()["waiters"] == 0
    assert fake_judge.stats()["total"] == 4
