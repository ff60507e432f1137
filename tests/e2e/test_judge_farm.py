"""The judge farm end to end: a real ``serve`` process in front of several fake-judge farm
nodes (real HTTP processes on loopback; every latency here is simulated), one client
channel. The nodes count which pairs they judged, so the tests see where each cohort's
passes went, and their ``GET /wait`` long-poll replaces sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.testing.heuristic import pair_key
from tests.judge.processes import PY, FakeJudgeProcess, RestartableServer, free_port

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
# Every request generates for 0.1 s of simulated time (20 tokens at 200 tokens/s).
NODE = ("--slots", "4", "--tokens-per-s", "200", "--output-tokens", "20")
FAST_FARM = {
    "GENRM_JUDGE__OUTLIER_BASE_EJECTION_S": "0.5",
    "GENRM_JUDGE__OUTLIER_CONSECUTIVE_FAILURES": "3",
    "GENRM_JUDGE__PROBE_INTERVAL_S": "0.2",
    "GENRM_JUDGE_PROBE_TIMEOUT_S": "1",
    "GENRM_GENRM_PARSE_RETRIES": "3",
    "GENRM_GENRM_PARSE_RETRY_SLEEP_S": "0.01",
}


def _answer(group: int, k: int) -> str:
    return f"{2 + 7 * k} is prime, says member {k} of group {group}."


def _request(group: int, k: int, size: int, attempt: int = 0) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(
            group_id=f"farm-{group}", group_attempt=attempt, rollout_index=k, group_size=size
        ),
        prompt=pb.Prompt(
            messages=[pb.ChatMessage(role="user", content=f"Group {group}: name a prime number.")]
        ),
        candidate=pb.Candidate(output_text=_answer(group, k)),
    )


async def _run_groups(target: str, groups: int, size: int, first: int = 0) -> list[pb.MemberResult]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        replies = await asyncio.gather(
            *(
                stub.SubmitMember(_request(g, k, size), timeout=120)
                for g in range(first, first + groups)
                for k in range(size)
            )
        )
    return [r.result for r in replies]


def _group_of_pairs(groups: int, size: int) -> dict[str, int]:
    """Every ordered answer pair a group's passes can send, to its group."""
    return {
        pair_key(_answer(g, i), _answer(g, j)): g
        for g in range(groups)
        for i in range(size)
        for j in range(size)
        if i != j
    }


@contextlib.contextmanager
def _farm(n: int, *args: str) -> Iterator[list[FakeJudgeProcess]]:
    nodes = [FakeJudgeProcess(None, *args) for _ in range(n)]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@contextlib.contextmanager
def _serving(nodes: list[FakeJudgeProcess], tmp: Path, **env: str) -> Iterator[RestartableServer]:
    server = RestartableServer(
        "memory://", [n.url for n in nodes], tmp / "server.log", **{**FAST_FARM, **env}
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


def _state(server: RestartableServer, node: FakeJudgeProcess, state: str) -> float:
    return server.metric(f'genrm_judge_endpoint_state{{endpoint="{node.url}",state="{state}"}}')


def _eventually(check: object, timeout: float = 30.0) -> None:
    """Wait for another process to reach a state (its change is not ours to await)."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the farm never reached the expected state")
        time.sleep(0.05)


def test_four_endpoints_share_a_uniform_load_and_keep_each_cohorts_passes_on_one(
    tmp_path: Path,
) -> None:
    groups, size = 64, 4
    with (
        _farm(4, *NODE) as nodes,
        _serving(nodes, tmp_path, GENRM_JUDGE_MAX_CONCURRENCY="32") as server,
    ):
        results = asyncio.run(_run_groups(server.target, groups, size))
        stats = [n.stats() for n in nodes]
        kept = server.metric('genrm_judge_affinity_total{result="kept"}')
        spilled = server.metric('genrm_judge_affinity_total{result="spilled"}')
    assert not any(r.mask_sample for r in results)
    counts = [s["total"] for s in stats]
    assert sum(counts) == groups * size  # circular: one pass per member, none repeated
    mean = sum(counts) / len(counts)
    assert all(abs(c - mean) <= 0.2 * mean for c in counts), counts
    owner = _group_of_pairs(groups, size)
    nodes_of_group: dict[int, set[int]] = {}
    for index, s in enumerate(stats):
        for key in s["pairs"]:
            nodes_of_group.setdefault(owner[key], set()).add(index)
    # A cohort's passes leave its node only when a load bound (above or below) forces a
    # spill: every extra node a cohort touched is one spilled request at least. How many
    # spill depends on how the keys in flight happen to hash (at this saturation about
    # half did in one run), so the share itself is not pinned, only that both count.
    extra_nodes = sum(len(g) - 1 for g in nodes_of_group.values())
    assert extra_nodes <= spilled, (extra_nodes, spilled)
    assert kept + spilled == groups * size and kept > 0, (kept, spilled)


def test_a_sigkilled_endpoint_costs_no_reward_is_ejected_and_readmitted_when_back(
    tmp_path: Path,
) -> None:
    groups, size = 48, 4
    with (
        _farm(3, *NODE) as nodes,
        _serving(nodes, tmp_path, GENRM_JUDGE_MAX_CONCURRENCY="24") as server,
    ):

        async def run() -> list[pb.MemberResult]:
            work = asyncio.ensure_future(_run_groups(server.target, groups, size))
            # Once the victim is generating, kill it: its requests fail mid-way.
            await asyncio.to_thread(nodes[0].wait_for, running=2)
            nodes[0].kill()
            return await work

        results = asyncio.run(run())
        assert not any(r.mask_sample for r in results)
        # Every pass's verdict came from exactly one successful call on a live node.
        survivors = Counter[str]()
        for node in nodes[1:]:
            survivors.update(node.stats()["pairs"])
        assert all(count == 1 for count in survivors.values())
        _eventually(lambda: server.metric("genrm_judge_endpoint_ejections_total") >= 1)
        nodes[0].start()  # the same port again
        _eventually(lambda: _state(server, nodes[0], "healthy") == 1)
        more = asyncio.run(_run_groups(server.target, 8, size))
    assert not any(r.mask_sample for r in more)
    assert "judge endpoint" in (log := (tmp_path / "server.log").read_text())
    assert '"judge_event": "ejected"' in log and '"judge_event": "readmitted"' in log


def test_a_hanging_endpoint_costs_a_pass_its_hedge_point_not_the_request_timeout(
    tmp_path: Path,
) -> None:
    groups, size = 32, 4
    with (
        _farm(3, *NODE) as nodes,
        _serving(
            nodes,
            tmp_path,
            GENRM_JUDGE_MAX_CONCURRENCY="12",
            GENRM_JUDGE__MAX_IN_FLIGHT="4",  # saturated: a hedge waits for a slot elsewhere
            GENRM_JUDGE_REQUEST_TIMEOUT_S="600",
            GENRM_JUDGE__HEDGE_MIN_SAMPLES="8",
            GENRM_JUDGE__HEDGE_FLOOR_S="0.3",
            GENRM_JUDGE__OUTLIER_BASE_EJECTION_S="600",
        ) as server,
    ):
        warm = asyncio.run(_run_groups(server.target, 8, size))  # latencies for the hedge
        assert not any(r.mask_sample for r in warm)
        nodes[0].control(mode="hang")
        started = time.monotonic()
        results = asyncio.run(_run_groups(server.target, groups, size))
        took = time.monotonic() - started
        assert not any(r.mask_sample for r in results)
        assert took < 60, took  # far below the 600 s request timeout
        assert _state(server, nodes[0], "ejected") == 1
        assert server.metric("genrm_judge_hedges_total") >= 1


def test_serve_exits_2_naming_the_model_no_endpoint_serves(tmp_path: Path) -> None:
    with _farm(2, "--model", "genrm") as nodes:
        env = RestartableServer("memory://", [n.url for n in nodes], tmp_path / "log").env
        env["GENRM_JUDGE__MODEL"] = "genrm-typo"
        proc = subprocess.run(
            [*PY, "serve", "--listen", f"127.0.0.1:{free_port()}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("genrm-grpc:")]
    assert len(lines) == 1, proc.stderr
    assert "'genrm-typo'" in lines[0] and "serves genrm" in lines[0]
    assert nodes[0].url in lines[0] and nodes[1].url in lines[0]


def test_an_endpoint_that_stops_serving_the_model_is_taken_out_and_back(
    tmp_path: Path,
) -> None:
    with _farm(2, *NODE) as nodes, _serving(nodes, tmp_path) as server:
        nodes[1].control(models=["another-model"])
        _eventually(lambda: _state(server, nodes[1], "wrong_model") == 1)
        view = subprocess.run(
            [*PY, "judges", "--metrics", server.env["GENRM_METRICS_LISTEN"], "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert view.returncode == 0, view.stderr  # one endpoint is still healthy
        states = {row["endpoint"]: row["state"] for row in json.loads(view.stdout)}
        assert states == {nodes[0].url: "healthy", nodes[1].url: "wrong_model"}
        before = nodes[1].stats()["total"]
        results = asyncio.run(_run_groups(server.target, 8, 4))
        assert not any(r.mask_sample for r in results)
        assert nodes[1].stats()["total"] == before  # no request went to it
        nodes[1].control(models=["genrm"])
        _eventually(lambda: _state(server, nodes[1], "healthy") == 1)


def test_a_superseded_attempts_in_flight_judge_requests_are_closed_at_the_judge(
    tmp_path: Path,
) -> None:
    # Slow nodes: an attempt's passes are all generating when the next attempt arrives.
    slow = ("--slots", "8", "--tokens-per-s", "1", "--output-tokens", "600")
    with (
        _farm(2, *slow) as nodes,
        _serving(nodes, tmp_path, GENRM_JUDGE_MAX_CONCURRENCY="8") as server,
    ):

        async def run() -> None:
            async with grpc.aio.insecure_channel(server.target) as channel:
                stub = pb_grpc.CohortServiceStub(channel)
                old = [
                    asyncio.ensure_future(stub.SubmitMember(_request(0, k, 4), timeout=120))
                    for k in range(4)
                ]
                await asyncio.to_thread(_wait_running, nodes, 4)
                newer = stub.SubmitMember(_request(0, 0, 4, attempt=1), timeout=5)
                with contextlib.suppress(grpc.RpcError):
                    await newer  # waits for its siblings: its deadline ends it
                for call in old:
                    with pytest.raises(grpc.RpcError) as excinfo:
                        await call
                    assert excinfo.value.code() == grpc.StatusCode.ABORTED

        asyncio.run(run())
        aborted = sum(n.stats()["node"]["aborted"] for n in nodes)
        assert aborted == 4  # every in-flight request of the old attempt, closed
        assert server.metric('genrm_judge_requests_total{outcome="cancelled"}') == 4


def _wait_running(nodes: list[FakeJudgeProcess], total: int) -> None:
    _eventually(lambda: sum(n.stats()["node"]["running"] for n in nodes) >= total)


def test_health_is_not_serving_while_no_endpoint_can_judge(tmp_path: Path) -> None:
    with (
        _farm(1, *NODE) as nodes,
        _serving(nodes, tmp_path, GENRM_JUDGE_UNREACHABLE_WINDOW_S="0.2") as server,
    ):

        def health() -> int:
            return subprocess.run(
                [*PY, "health", "--server", server.target, "--timeout-s", "5"],
                capture_output=True,
                timeout=60,
            ).returncode

        assert health() == 0
        nodes[0].control(models=["another-model"])  # answers, but cannot judge
        _eventually(lambda: health() != 0)
        nodes[0].control(models=["genrm"])
        _eventually(lambda: health() == 0)
