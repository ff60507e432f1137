"""Three ``genrm-grpc serve`` processes sharing one real redis-server (docs/scaling.md).

Members of every group are sent round-robin across the replicas; the rewards must be
the ones a single process gives for the same groups, with exactly one judge call per
pass (the fake judge counts every request per pair). Failover kills replicas with
SIGKILL at a point read from Redis itself (journaled passes, active cohorts), never
after a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import ChannelOptions, CohortClient, RetryPolicy
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genrm_grpc.testing.redis_server import RedisServer
from tests.docs.stop_statement import documented_waiter_reason
from tests.e2e.support import error_reason, running, until
from tests.judge.processes import FakeJudgeProcess, RestartableServer, free_port

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
SIZE = 6  # circular strategy: 6 judge passes per group
SERVICE = "genrm.cohort.v1.CohortService"


def _member(group: str, k: int, *, attempt: int = 0) -> pb.SubmitMemberRequest:
    ref = pb.MemberRef(rollout_index=k, group_size=SIZE, group_id=group, group_attempt=attempt)
    answer = f"The answer is {2 + k * 7} for {group}; reasoning {'x' * (k * 13)}"
    return pb.SubmitMemberRequest(
        member=ref, prompt=PROMPT, candidate=pb.Candidate(output_text=answer)
    )


#: Replicas in these tests renew their evaluation lease every 2/3 s; a takeover comes
#: 2 s after a replica stops renewing.
LEASE_S = "2"


def replica_process(store: str, judge_url: str, log: Path, **settings: str) -> RestartableServer:
    return RestartableServer(
        store, judge_url, log, **{"GENRM_REPLICA_LEASE_S": LEASE_S, **settings}
    )


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess(None, "--latency-ms", "150") as process:
        yield process


@pytest.fixture
def replicas(
    redis_server: RedisServer, judge: FakeJudgeProcess, tmp_path: Path
) -> Iterator[list[RestartableServer]]:
    started = [
        replica_process(redis_server.url, judge.url, tmp_path / f"replica-{n}.log")
        for n in range(3)
    ]
    with running(started):
        yield started


def _members_stored(client: redis.Redis) -> int:
    """Members of active cohorts in Redis (their ``m:`` fields): a point read, not a sleep."""
    return sum(
        len([f for f in client.hkeys(name) if f.startswith(b"m:")])
        for name in client.keys("genrm:c:*")
    )


async def _all_but_the_last(
    targets: list[str], client: redis.Redis, group: str, timeout: float
) -> list[asyncio.Future[Any]]:
    """Members 0..SIZE-2 of ``group`` on replicas 0 and 1, waiting; returns once Redis
    holds them all (a point read, not a sleep). The last member, sent to replica 2,
    completes the cohort there, so replica 2 evaluates it."""
    calls = [
        asyncio.ensure_future(_submit(targets[k % 2], _member(group, k), timeout=timeout))
        for k in range(SIZE - 1)
    ]
    await asyncio.to_thread(until, lambda: _members_stored(client) == SIZE - 1)
    return calls


def _pair_counts(judge: FakeJudgeProcess) -> dict[str, int]:
    return dict(judge.stats()["pairs"])


async def _submit(target: str, request: pb.SubmitMemberRequest, timeout: float = 60) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        return await pb_grpc.CohortServiceStub(channel).SubmitMember(request, timeout=timeout)


async def _round_robin(targets: list[str], groups: list[str]) -> dict[tuple[str, int], float]:
    """Every member of every group through SubmitMember, member k to replica k mod n."""
    calls = [
        _submit(targets[(g + k) % len(targets)], _member(group, k))
        for g, group in enumerate(groups)
        for k in range(SIZE)
    ]
    replies = await asyncio.gather(*calls)
    return {
        (r.result.member.group_id, r.result.member.rollout_index): r.result.reward for r in replies
    }


async def _stream_round_robin(
    targets: list[str], groups: list[str]
) -> dict[tuple[str, int], float]:
    """Every member through StreamGroups: one stream per replica, member k on stream k mod n."""

    async def stream(target: str, requests: list[pb.SubmitMemberRequest]) -> list[Any]:
        async def source() -> AsyncIterator[pb.StreamGroupsRequest]:
            for request in requests:
                yield pb.StreamGroupsRequest(member=request)

        results = []
        async with grpc.aio.insecure_channel(target) as channel:
            call = pb_grpc.CohortServiceStub(channel).StreamGroups(source(), timeout=60)
            async for event in call:
                if event.HasField("result"):
                    results.append(event.result)
                elif event.HasField("error"):
                    raise AssertionError(f"member refused: {event.error}")
        return results

    share: list[list[pb.SubmitMemberRequest]] = [[] for _ in targets]
    for g, group in enumerate(groups):
        for k in range(SIZE):
            share[(g + k) % len(targets)].append(_member(group, k))
    streams = await asyncio.gather(*(stream(t, s) for t, s in zip(targets, share, strict=True)))
    return {
        (r.member.group_id, r.member.rollout_index): r.reward
        for results in streams
        for r in results
    }


async def _single_process(judge: FakeJudgeProcess, tmp_path: Path, groups: list[str]) -> Any:
    reference = replica_process(
        f"sqlite:///{tmp_path / 'reference.sqlite3'}", judge.url, tmp_path / "reference.log"
    ).start()
    try:
        return await _round_robin([reference.target], groups)
    finally:
        reference.close()


async def test_members_sent_round_robin_to_three_replicas_get_the_single_process_rewards(
    replicas: list[RestartableServer], judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    targets = [r.target for r in replicas]
    unary = [f"unary-{n}" for n in range(4)]
    streamed = [f"stream-{n}" for n in range(4)]
    expected = await _single_process(judge, tmp_path, unary + streamed)
    before = _pair_counts(judge)

    got = await _round_robin(targets, unary)
    got.update(await _stream_round_robin(targets, streamed))

    assert got == expected
    after = _pair_counts(judge)
    grown = {pair: after[pair] - before.get(pair, 0) for pair in after}
    # Exactly one judge call per pass in the deployment: 8 groups × 6 passes, each once.
    assert sum(grown.values()) == len(unary + streamed) * SIZE
    assert set(grown.values()) == {1}


async def test_resends_and_replays_on_other_replicas_are_answered_from_the_shared_state(
    replicas: list[RestartableServer], judge: FakeJudgeProcess
) -> None:
    targets = [r.target for r in replicas]
    first = await _round_robin(targets, ["g"])
    calls_after_first = sum(_pair_counts(judge).values())
    # Every member again, each to a replica that did not take it the first time.
    again = await asyncio.gather(
        *(_submit(targets[(k + 1) % 3], _member("g", k)) for k in range(SIZE))
    )
    assert all(r.result.replayed for r in again)
    assert {
        (r.result.member.group_id, r.result.member.rollout_index): r.result.reward for r in again
    } == first
    assert sum(_pair_counts(judge).values()) == calls_after_first  # no judge call
    # A different answer in a taken slot conflicts on every replica.
    conflicting = _member("g", 0)
    conflicting.candidate.output_text = "something else"
    with pytest.raises(grpc.RpcError) as refused:
        await _submit(targets[2], conflicting)
    assert error_reason(refused.value) == "SLOT_CONFLICT"
    # A newer attempt supersedes the old one wherever its members arrive.
    newer = [_submit(targets[k % 3], _member("g", k, attempt=1)) for k in range(SIZE)]
    replies = await asyncio.gather(*newer)
    assert {r.result.member.group_attempt for r in replies} == {1}
    with pytest.raises(grpc.RpcError) as old:
        await _submit(targets[1], _member("g", 0, attempt=0))
    assert error_reason(old.value) == "ATTEMPT_SUPERSEDED"
    # Any replica describes the group from the shared state.
    for target in targets:
        async with grpc.aio.insecure_channel(target) as channel:
            info = (
                await pb_grpc.CohortServiceStub(channel).GetCohort(
                    pb.GetCohortRequest(member=pb.MemberRef(group_id="g")), timeout=10
                )
            ).cohort
        assert info.phase == pb.COHORT_PHASE_COMPLETED
        assert info.latest_attempt == 1 and len(info.present_indices) == SIZE


async def test_a_replica_killed_mid_evaluation_is_taken_over_without_judging_a_pass_twice(
    replicas: list[RestartableServer], judge: FakeJudgeProcess, redis_server: RedisServer
) -> None:
    client = redis.Redis(port=redis_server.port)
    # The collector's own client over all three replicas (as behind a headless Service):
    # round-robin per call, and its retry of an UNAVAILABLE call lands on a live replica.
    target = "ipv4:" + ",".join(r.target for r in replicas)
    options = ChannelOptions(extra=(("grpc.lb_policy_name", "round_robin"),))
    retry = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=0.5)

    def journaled() -> int:
        names = client.keys("genrm:v:*")
        return 0 if not names else int(client.hlen(names[0]))

    async with CohortClient(target, options=options, retry=retry) as collector:
        calls = [
            asyncio.ensure_future(
                collector.submit_member(
                    {
                        "group_id": "failover",
                        "group_attempt": 0,
                        "rollout_index": k,
                        "group_size": SIZE,
                    },
                    "Name a prime number.",
                    f"The answer is {2 + k * 7}; reasoning {'x' * (k * 13)}",
                    timeout=90,
                )
            )
            for k in range(SIZE)
        ]
        # Two permits, 150 ms per verdict: kill the evaluator once some passes are
        # journaled and others are in flight. The lease names the process holding it.
        await asyncio.to_thread(until, lambda: journaled() >= 2)
        (lease,) = [client.get(name) for name in client.keys("genrm:e:*")]
        pid = int(lease.decode().split(":", 1)[1].split("/")[1])
        (evaluator,) = [r for r in replicas if r.proc is not None and r.proc.pid == pid]
        evaluator.kill()
        killed_at = time.monotonic()
        done_before_kill = journaled()
        assert 2 <= done_before_kill < SIZE
        before = _pair_counts(judge)
        results = await asyncio.gather(*calls)
        took = time.monotonic() - killed_at
    assert sorted(r.member.rollout_index for r in results) == list(range(SIZE))
    assert all(not r.mask_sample for r in results)
    assert took < 2 + 5  # replica_lease_s + a few seconds
    after = _pair_counts(judge)
    grown = {pair: after[pair] - before.get(pair, 0) for pair in after}
    # Only passes without a journaled verdict were judged after the kill (those in
    # flight at the kill once more); no finished pass was judged twice.
    assert sum(grown.values()) <= SIZE - done_before_kill
    assert {r.judge_passes_resumed for r in results} == {done_before_kill}
    survivors = [r for r in replicas if r is not evaluator]
    assert sum(r.metric("genrm_replica_takeovers_total") for r in survivors) == 1
    assert all(r.metric("genrm_store_round_trip_seconds_count") > 0 for r in survivors)
    assert all(r.metric("genrm_store_up") == 1 for r in survivors)


async def test_a_replica_killed_while_cohorts_collect_loses_nothing(
    replicas: list[RestartableServer], judge: FakeJudgeProcess, redis_server: RedisServer
) -> None:
    targets = [r.target for r in replicas]
    client = redis.Redis(port=redis_server.port)
    first_half = [
        asyncio.ensure_future(_submit(targets[0], _member(f"c{n}", k), timeout=90))
        for n in range(3)
        for k in range(SIZE // 2)
    ]

    # Kill replica 0 once Redis holds every member it took (a known point, no sleep).
    await asyncio.to_thread(until, lambda: _members_stored(client) == 3 * (SIZE // 2))
    replicas[0].kill()
    for call in first_half:
        with pytest.raises(grpc.RpcError):
            await call
    # The second halves go to the surviving replicas; the first halves are resent
    # there too (as a collector retrying on another replica does): attached, not lost.
    replies = await asyncio.gather(
        *(_submit(targets[1 + (k % 2)], _member(f"c{n}", k)) for n in range(3) for k in range(SIZE))
    )
    assert all(not r.result.mask_sample for r in replies)
    assert sum(_pair_counts(judge).values()) == 3 * SIZE  # one judge call per pass


async def test_redis_stopped_mid_run_gives_typed_errors_and_health_follows_it(
    replicas: list[RestartableServer], judge: FakeJudgeProcess, redis_server: RedisServer
) -> None:
    targets = [r.target for r in replicas]

    async def health(target: str) -> int:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
            return int(reply.status)

    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    first = await _round_robin(targets, ["before"])
    assert len(first) == SIZE
    redis_server.stop()
    with pytest.raises(grpc.RpcError) as down:
        await _submit(targets[0], _member("during", 0), timeout=30)
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(down.value) == "STORE_UNAVAILABLE"
    deadline = time.monotonic() + 10
    while any([await health(t) != not_serving for t in targets]):
        assert time.monotonic() < deadline, "health did not turn NOT_SERVING"
        await asyncio.sleep(0.1)
    redis_server.restart()  # same port, same AOF directory
    deadline = time.monotonic() + 15
    while any([await health(t) != serving for t in targets]):
        assert time.monotonic() < deadline, "health did not turn SERVING again"
        await asyncio.sleep(0.1)
    after = await _round_robin(targets, ["during", "after"])
    assert len(after) == 2 * SIZE
    replayed = await _submit(targets[2], _member("before", 3))
    assert replayed.result.replayed and replayed.result.reward == first[("before", 3)]


def test_a_replica_whose_redis_is_unreachable_exits_at_start_up_naming_the_address() -> None:
    port = free_port()  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", "127.0.0.1:0"],
        env={
            **os.environ,
            "GENRM_STORE": f"redis://:secret@127.0.0.1:{port}/0",
            "GENRM_JUDGE_PROBE": "off",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("genrm-grpc: ")
    assert f"redis://127.0.0.1:{port}/0" in lines[-1]
    assert "secret" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture
def short_deadline_replicas(
    redis_server: RedisServer, judge: FakeJudgeProcess, tmp_path: Path
) -> Iterator[list[RestartableServer]]:
    started = [
        replica_process(
            redis_server.url,
            judge.url,
            tmp_path / f"replica-{n}.log",
            GENRM_COHORT_COLLECTION_TIMEOUT_S="1.5",
        )
        for n in range(3)
    ]
    with running(started):
        yield started


async def test_a_collection_deadline_fires_once_across_the_replicas(
    short_deadline_replicas: list[RestartableServer], tmp_path: Path
) -> None:
    replicas = short_deadline_replicas
    targets = [r.target for r in replicas]
    # Two of six members, on two replicas: the cohort can only end by its deadline.
    calls = [_submit(targets[k], _member("late", k), timeout=30) for k in range(2)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, grpc.RpcError)
        assert outcome.code() == grpc.StatusCode.ABORTED
        assert error_reason(outcome) == "COHORT_FAILED"
        assert "collection deadline expired" in (outcome.details() or "")
    # Every replica swept for it; exactly one ended it (one outcome line in all logs).
    for replica in replicas:
        replica.close()
    ended = [
        line
        for replica in replicas
        for line in replica.log.read_text().splitlines()
        if '"cohort failed"' in line and "late" in line
    ]
    assert len(ended) == 1
    # A member sent after the deadline gets the recorded failure from any replica.
    replicas[2].start()
    with pytest.raises(grpc.RpcError) as late:
        await _submit(targets[2], _member("late", 4), timeout=30)
    assert error_reason(late.value) == "COHORT_FAILED"


async def test_waiters_get_outcomes_published_while_their_replica_was_not_listening(
    replicas: list[RestartableServer], redis_server: RedisServer
) -> None:
    """The channel is at-most-once: a replica re-reads what it waits for on resubscribing."""
    targets = [r.target for r in replicas]
    client = redis.Redis(port=redis_server.port)
    waiting = await _all_but_the_last(targets, client, "deaf", timeout=60)
    # From before the last member until after the outcome is stored, keep cutting every
    # subscriber's connection: the message about it reaches no replica listening.
    stop = asyncio.Event()

    def cut() -> int:
        cuts = 0
        while not stop.is_set():
            cuts += int(client.client_kill_filter(_type="pubsub"))
        return cuts

    cutter = asyncio.ensure_future(asyncio.to_thread(cut))
    last = await _submit(targets[2], _member("deaf", SIZE - 1), timeout=60)
    await asyncio.to_thread(until, lambda: bool(client.keys("genrm:t:*")))
    stop.set()
    assert await cutter > 0
    results = await asyncio.gather(*waiting)
    assert [r.result.reward for r in results] + [last.result.reward] != []
    assert all(not r.result.mask_sample for r in [*results, last])
    lost = sum(r.log.read_text().count("lost the replicas' channel") for r in replicas)
    assert lost > 0


def _legacy_member(task: int, k: int, text: str = "") -> pb.SubmitMemberRequest:
    ref = pb.MemberRef(rollout_index=k, group_size=SIZE, task_index=task)
    answer = text or f"The answer is {3 + k * 5} for task {task}"
    return pb.SubmitMemberRequest(
        member=ref, prompt=PROMPT, candidate=pb.Candidate(output_text=answer)
    )


async def test_a_paused_evaluator_is_taken_over_and_its_late_result_is_never_published(
    replicas: list[RestartableServer], judge: FakeJudgeProcess, redis_server: RedisServer
) -> None:
    targets = [r.target for r in replicas]
    client = redis.Redis(port=redis_server.port)
    early = await _all_but_the_last(targets, client, "paused", timeout=90)
    on_evaluator = asyncio.ensure_future(
        _submit(targets[2], _member("paused", SIZE - 1), timeout=90)
    )
    await asyncio.to_thread(until, lambda: bool(client.keys("genrm:v:*")))
    evaluator = replicas[2].proc
    assert evaluator is not None
    evaluator.send_signal(signal.SIGSTOP)  # a long GC pause, a VM migration
    try:
        results = await asyncio.gather(*early)  # taken over past replica_lease_s
    finally:
        evaluator.send_signal(signal.SIGCONT)
    # Woken up, the old evaluator's lease is gone: it publishes nothing of its own and
    # its caller gets the outcome the deployment published.
    late = await on_evaluator
    rewards = {r.result.member.rollout_index: r.result.reward for r in [*results, late]}
    assert len(rewards) == SIZE
    assert all(not r.result.mask_sample for r in [*results, late])
    log = replicas[2].log.read_text()
    assert '"cohort completed"' not in log  # it never ended the cohort
    assert any("took over the evaluation" in r.log.read_text() for r in replicas[:2])
    # Each pass was judged at most twice (once more only if in flight at the pause).
    assert all(count <= 2 for count in _pair_counts(judge).values())


async def test_legacy_cohorts_spread_over_replicas_match_a_single_process_and_stay_fenced(
    replicas: list[RestartableServer], judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    targets = [r.target for r in replicas]
    reference = replica_process(
        f"sqlite:///{tmp_path / 'legacy.sqlite3'}", judge.url, tmp_path / "legacy.log"
    ).start()
    try:
        expected = await asyncio.gather(
            *(_submit(reference.target, _legacy_member(7, k)) for k in range(SIZE))
        )
    finally:
        reference.close()
    got = await asyncio.gather(
        *(_submit(targets[k % 3], _legacy_member(7, k)) for k in range(SIZE))
    )
    assert [r.result.reward for r in got] == [r.result.reward for r in expected]
    # A legacy cohort masked by a judge failure stays fenced on every replica.
    judge.set_faults(fail_503_rate=1.0)
    masked = await asyncio.gather(
        *(_submit(targets[k % 3], _legacy_member(8, k)) for k in range(SIZE))
    )
    assert all(r.result.mask_sample for r in masked)
    judge.set_faults(fail_503_rate=0.0)
    calls = sum(_pair_counts(judge).values())
    fenced = await _submit(targets[1], _legacy_member(8, 0, text="a fresh answer"))
    assert fenced.result.replayed and fenced.result.mask_sample
    assert sum(_pair_counts(judge).values()) == calls


async def test_a_draining_evaluator_hands_its_cohort_over_at_once_not_after_its_lease(
    redis_server: RedisServer, judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    # A 30 s lease: a takeover that waited for it would blow the bound below.
    started = [
        replica_process(
            redis_server.url,
            judge.url,
            tmp_path / f"replica-{n}.log",
            GENRM_REPLICA_LEASE_S="30",
            GENRM_SHUTDOWN_GRACE_S="0.05",
        )
        for n in range(3)
    ]
    with running(started) as replicas:
        targets = [r.target for r in replicas]
        client = redis.Redis(port=redis_server.port)
        early = await _all_but_the_last(targets, client, "drain", timeout=60)
        on_evaluator = asyncio.ensure_future(
            _submit(targets[2], _member("drain", SIZE - 1), timeout=60)
        )
        await asyncio.to_thread(until, lambda: bool(client.keys("genrm:v:*")))
        stopping = time.monotonic()
        assert await asyncio.to_thread(replicas[2].stop) == 0  # SIGTERM: a rolling update
        results = await asyncio.gather(*early)
        assert time.monotonic() - stopping < 15  # far below the 30 s lease
        assert all(not r.result.mask_sample for r in results)
        with pytest.raises(grpc.RpcError) as interrupted:
            await on_evaluator
        assert interrupted.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(interrupted.value) == documented_waiter_reason("redis")
        # The collector resends the interrupted member elsewhere: replayed, same cohort.
        again = await _submit(targets[0], _member("drain", SIZE - 1))
        assert again.result.replayed
        assert any("took over the evaluation" in r.log.read_text() for r in replicas[:2])


@pytest.fixture
def eager_replicas(
    redis_server: RedisServer, judge: FakeJudgeProcess, tmp_path: Path
) -> Iterator[list[RestartableServer]]:
    started = [
        replica_process(
            redis_server.url,
            judge.url,
            tmp_path / f"eager-{n}.log",
            GENRM_JUDGE_SCHEDULE="eager",
        )
        for n in range(3)
    ]
    with running(started):
        yield started


async def test_eager_replicas_give_the_single_process_rewards_judging_each_pass_once(
    eager_replicas: list[RestartableServer], judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    groups = [f"eager-{n}" for n in range(4)]
    expected = await _single_process(judge, tmp_path, groups)
    before = _pair_counts(judge)
    got = await _round_robin([r.target for r in eager_replicas], groups)
    assert got == expected
    after = _pair_counts(judge)
    grown = {pair: after[pair] - before.get(pair, 0) for pair in after}
    assert sum(grown.values()) == len(groups) * SIZE
    assert set(grown.values()) == {1}


async def test_an_eager_evaluator_killed_while_its_group_collects_is_taken_over_judging_once(
    eager_replicas: list[RestartableServer], judge: FakeJudgeProcess, redis_server: RedisServer
) -> None:
    client = redis.Redis(port=redis_server.port)
    targets = [r.target for r in eager_replicas]

    def journaled() -> int:
        names = client.keys("genrm:v:*")
        return 0 if not names else int(client.hlen(names[0]))

    # Members 0..SIZE-2 on replicas 0 and 1: member 0 makes replica 0 the evaluator,
    # which judges the pairs among them while the last member is still missing.
    first = [
        asyncio.ensure_future(_submit(targets[k % 2], _member("early", k), timeout=90))
        for k in range(SIZE - 1)
    ]
    await asyncio.to_thread(until, lambda: journaled() >= 2)
    (lease,) = [client.get(name) for name in client.keys("genrm:e:*")]
    pid = int(lease.decode().split(":", 1)[1].split("/")[1])
    (evaluator,) = [r for r in eager_replicas if r.proc is not None and r.proc.pid == pid]
    evaluator.kill()
    done_before_kill = journaled()
    assert 2 <= done_before_kill < SIZE
    before = _pair_counts(judge)
    survivors = [r.target for r in eager_replicas if r is not evaluator]
    # Every member (resent where its replica died) and the last one, on the survivors.
    replies = await asyncio.gather(
        *(_submit(survivors[k % 2], _member("early", k), timeout=90) for k in range(SIZE))
    )
    for call in first:
        with contextlib.suppress(grpc.RpcError):  # those on the killed replica
            await call
    assert all(not r.result.mask_sample for r in replies)
    assert {r.result.judge_passes_resumed for r in replies} == {done_before_kill}
    after = _pair_counts(judge)
    grown = {pair: after[pair] - before.get(pair, 0) for pair in after}
    # Only passes without a journaled verdict were judged after the kill.
    assert sum(grown.values()) <= SIZE - done_before_kill
