"""SIGKILL of the real server process, and a restart on the same SQLite file.

The file is behind the runtime's in-process group store, as a single process serves.

The judge is the fake judge process (deterministic verdicts, per-pair request counters);
the server runs as ``genrm-grpc serve`` on a fixed port, killed with SIGKILL (no drain,
no flush) and started again on the same store. What happened before the kill is read
from the store file itself (a second SQLite reader, as WAL allows), so the kill comes
at a known point, never after a sleep.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import CohortClient, RetryPolicy

from tests.e2e.support import error_reason, until
from tests.judge.processes import FakeJudgeProcess, RestartableServer

pytestmark = pytest.mark.e2e


PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
SIZE = 6  # circular strategy: 6 judge passes


def _member(group: str | None, k: int, *, attempt: int = 0, text: str = "") -> Any:
    ref = pb.MemberRef(rollout_index=k, group_size=SIZE)
    if group is None:
        ref.task_index = 7
    else:
        ref.group_id = group
        ref.group_attempt = attempt
    answer = text or f"The answer is {2 + k * 7}; reasoning {'x' * (k * 13)}"
    return pb.SubmitMemberRequest(
        member=ref, prompt=PROMPT, candidate=pb.Candidate(output_text=answer)
    )


def sqlite_server(store: Path, judge_url: str, **settings: str) -> RestartableServer:
    """The server under test: ``genrm-grpc serve`` over one SQLite file."""
    return RestartableServer(f"sqlite:///{store}", judge_url, store.with_suffix(".log"), **settings)


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess(None, "--latency-ms", "250") as process:
        yield process


@pytest.fixture
def server(tmp_path: Path, judge: FakeJudgeProcess) -> Iterator[RestartableServer]:
    server = sqlite_server(tmp_path / "state.sqlite3", judge.url)
    try:
        yield server
    finally:
        server.close()


def _rows(store: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
        return conn.execute(query).fetchall()


def _store(server: RestartableServer) -> Path:
    return Path(server.env["GENRM_STORE"].removeprefix("sqlite:///"))


async def _submit_all(target: str, requests: list[Any], timeout: float = 60) -> list[Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        return list(
            await asyncio.gather(*(stub.SubmitMember(r, timeout=timeout) for r in requests))
        )


async def _uninterrupted_rewards(judge: FakeJudgeProcess, tmp_path: Path) -> list[float]:
    """The same group on a server that never crashes (its own store file)."""
    reference = sqlite_server(tmp_path / "reference.sqlite3", judge.url)
    reference.start()
    try:
        replies = await _submit_all(reference.target, [_member("ref", k) for k in range(SIZE)])
    finally:
        reference.close()
    return [r.result.reward for r in replies]


def _pair_counts(judge: FakeJudgeProcess) -> dict[str, int]:
    return dict(judge.stats()["pairs"])


async def test_a_kill_mid_evaluation_resumes_judging_only_the_passes_not_journaled(
    server: RestartableServer, judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    server.start()
    store = _store(server)
    members = [_member("g", k) for k in range(SIZE)]
    waiting = asyncio.ensure_future(_submit_all(server.target, members))
    # Two permits, 250 ms per verdict: kill once some passes are journaled and others
    # are still being judged.
    await asyncio.to_thread(until, lambda: len(_rows(store, "SELECT 1 FROM verdicts")) >= 2)
    server.kill()
    journaled = _rows(store, "SELECT response_i, response_j FROM verdicts")
    assert 2 <= len(journaled) < SIZE
    before = _pair_counts(judge)
    with pytest.raises(grpc.RpcError) as lost:
        await waiting
    assert lost.value.code() == grpc.StatusCode.UNAVAILABLE  # the caller saw the crash

    server.start()
    replies = await _submit_all(server.target, members)  # the identical resend
    after = _pair_counts(judge)
    rewards = [r.result.reward for r in replies]
    assert all(not r.result.mask_sample for r in replies)
    assert {r.result.judge_passes_resumed for r in replies} == {len(journaled)}

    # No journaled pass was judged again: requests after the restart are exactly the
    # passes that had no verdict in the store.
    grown = {pair: after[pair] - before.get(pair, 0) for pair in after}
    assert sum(grown.values()) == SIZE - len(journaled)
    assert sorted(n for n in grown.values() if n) == [1] * (SIZE - len(journaled))
    assert rewards == await _uninterrupted_rewards(judge, tmp_path)


async def test_a_kill_mid_collection_keeps_members_and_the_deadline_counts_time_down(
    server: RestartableServer, judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    server.env["GENRM_COHORT_COLLECTION_TIMEOUT_S"] = "600"
    server.start()
    store = _store(server)
    early = [_member("c", k) for k in range(3)]
    waiting = asyncio.ensure_future(_submit_all(server.target, early))
    await asyncio.to_thread(until, lambda: len(_rows(store, "SELECT 1 FROM members")) == 3)
    killed_at = time.time()
    server.kill()
    with pytest.raises(grpc.RpcError):
        await waiting
    assert judge.stats()["total"] == 0

    server.start()
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        info = (await stub.GetCohort(pb.GetCohortRequest(member=early[0].member))).cohort
        assert list(info.present_indices) == [0, 1, 2]
        assert info.phase == pb.COHORT_PHASE_COLLECTING
        # The deadline is a wall-clock instant: the time spent down counted against it.
        assert info.seconds_to_deadline <= 600 - (time.time() - killed_at) + 1
    # The missing members complete it; the early ones are resent to get their results.
    replies = await _submit_all(server.target, [_member("c", k) for k in range(SIZE)])
    assert judge.stats()["total"] == SIZE  # each pass judged once
    assert [r.result.reward for r in replies] == await _uninterrupted_rewards(judge, tmp_path)


async def test_after_a_kill_replay_fencing_and_supersession_behave_as_before(
    server: RestartableServer, judge: FakeJudgeProcess
) -> None:
    server.env["GENRM_NUM_ROLLOUTS_PER_PROMPT"] = str(SIZE)
    server.start()
    done = await _submit_all(server.target, [_member("r", k) for k in range(SIZE)])
    # A newer attempt of another group supersedes its attempt 0 (still collecting).
    await _submit_all_partial(server.target, [_member("s", 0, attempt=0)])
    await _submit_all_partial(server.target, [_member("s", 0, attempt=1)])
    # A legacy cohort whose judge fails stays fenced.
    judge.set_faults(fail_400_rate=1.0)
    legacy = await _submit_all(server.target, [_member(None, k) for k in range(SIZE)])
    assert all(r.result.mask_sample for r in legacy)
    judge.set_faults(fail_400_rate=0.0)
    calls = judge.stats()["total"]
    server.kill()

    server.start()
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        again = [await stub.SubmitMember(_member("r", k), timeout=30) for k in range(SIZE)]
        assert all(r.result.replayed for r in again)
        assert [r.result.reward for r in again] == [r.result.reward for r in done]
        with pytest.raises(grpc.RpcError) as conflict:
            await stub.SubmitMember(_member("r", 0, text="another answer"), timeout=30)
        assert error_reason(conflict.value) == "SLOT_CONFLICT"
        with pytest.raises(grpc.RpcError) as old:
            await stub.SubmitMember(_member("s", 1, attempt=0), timeout=30)
        assert error_reason(old.value) == "ATTEMPT_SUPERSEDED"
        fenced = await stub.SubmitMember(_member(None, 0, text="a regenerated answer"), timeout=30)
        assert fenced.result.mask_sample and fenced.result.replayed
    assert judge.stats()["total"] == calls  # nothing judged again


async def _submit_all_partial(target: str, requests: list[Any]) -> None:
    """Send members of a group that stays incomplete: wait until each is accepted."""
    async with grpc.aio.insecure_channel(target) as channel:
        stream = pb_grpc.CohortServiceStub(channel).StreamGroups()
        for request in requests:
            await stream.write(pb.StreamGroupsRequest(member=request))
        for _ in requests:
            event = await stream.read()
            assert event.WhichOneof("event") == "accepted", event
        stream.cancel()


async def test_a_sigterm_drain_keeps_evaluating_work_and_the_restart_finishes_it(
    server: RestartableServer, judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    server.env["GENRM_SHUTDOWN_GRACE_S"] = "0.05"
    server.start()
    store = _store(server)
    members = [_member("d", k) for k in range(SIZE)]
    waiting = asyncio.ensure_future(_submit_all(server.target, members))
    await asyncio.to_thread(until, lambda: len(_rows(store, "SELECT 1 FROM verdicts")) >= 1)
    assert await asyncio.to_thread(server.stop) == 0
    with pytest.raises(grpc.RpcError) as interrupted:
        await waiting
    assert interrupted.value.code() == grpc.StatusCode.UNAVAILABLE
    journaled = len(_rows(store, "SELECT 1 FROM verdicts"))
    assert _rows(store, "SELECT phase FROM cohorts") == [("evaluating",)]
    before = judge.stats()["total"]

    server.start()
    replies = await _submit_all(server.target, members)
    assert judge.stats()["total"] - before == SIZE - journaled
    assert [r.result.reward for r in replies] == await _uninterrupted_rewards(judge, tmp_path)


def test_a_store_written_by_a_newer_server_stops_start_up_with_one_line(tmp_path: Path) -> None:
    store = tmp_path / "newer.sqlite3"
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA user_version = 99")
    proc = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", "127.0.0.1:0"],
        env={**os.environ, "GENRM_STORE": f"sqlite:///{store}", "GENRM_JUDGE_PROBE": "off"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("genrm-grpc: ") and "schema version 99" in lines[-1]
    assert "Traceback" not in proc.stderr


def test_a_second_server_on_the_same_store_file_is_refused(
    server: RestartableServer, tmp_path: Path
) -> None:
    server.start()
    proc = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", "127.0.0.1:0"],
        env={
            **{k: v for k, v in server.env.items() if k != "GENRM_METRICS_LISTEN"},
            "GENRM_JUDGE_PROBE": "off",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "in use by another server" in proc.stderr.strip().splitlines()[-1]


async def test_the_python_clients_own_retry_gets_every_reward_across_a_kill(
    server: RestartableServer, judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    """The collector does nothing special: CohortClient resends on UNAVAILABLE, the
    restarted server reattaches the resends, and only unjournaled passes are judged."""
    server.start()
    store = _store(server)
    retried = asyncio.Event()
    policy = RetryPolicy(max_attempts=20, max_backoff_s=1.0, on_retry=lambda *_: retried.set())
    async with CohortClient(server.target, retry=policy) as client:
        calls = [
            asyncio.ensure_future(
                client.submit_member(m.member, m.prompt, m.candidate, timeout=120)
            )
            for m in (_member("cli", k) for k in range(SIZE))
        ]
        await asyncio.to_thread(until, lambda: len(_rows(store, "SELECT 1 FROM verdicts")) >= 2)
        server.kill()
        journaled = len(_rows(store, "SELECT 1 FROM verdicts"))
        before = judge.stats()["total"]
        await retried.wait()  # the client saw UNAVAILABLE and is backing off
        await asyncio.to_thread(server.start)
        results = await asyncio.gather(*calls)
    assert judge.stats()["total"] - before == SIZE - journaled
    assert [r.reward for r in results] == await _uninterrupted_rewards(judge, tmp_path)
    assert {r.judge_passes_resumed for r in results} == {journaled}
