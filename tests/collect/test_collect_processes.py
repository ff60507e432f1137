"""Killing the collector process midway, then --resume: completed groups are not re-judged."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.support import gym_rows

pytestmark = pytest.mark.e2e

PY = [sys.executable, "-m", "genrm_grpc.cli"]
GROUPS = 6


@contextlib.contextmanager
def process(args: list[str], ready: str) -> Iterator[str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith(ready), line
        yield line[len(ready) :].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if proc.stdout is not None:
            proc.stdout.close()


def judge_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as reply:
        stats: dict[str, Any] = json.load(reply)
    return stats


def test_killed_collector_resumes_without_rejudging_completed_groups(tmp_path: Path) -> None:
    rows = []
    for n in range(GROUPS):
        answers = [f"Answer {k} to question {n}: {'prime ' * k}number." for k in range(4)]
        rows += gym_rows(f"Question {n}: name a prime number.", answers, task_index=n)
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    with (
        process(
            [*PY, "fake-judge", "--port", "0", "--latency-ms", "60"], "fake-judge listening on"
        ) as url,
        process(
            [
                *PY,
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--judge-url",
                url,
                "--judge-max-concurrency",
                "1",
                "--log-level",
                "WARNING",
            ],
            "genrm-grpc serving on",
        ) as target,
    ):
        argv = [
            *PY,
            "collect",
            "--server",
            target,
            "--input",
            str(source),
            "--output",
            str(out),
            "--concurrency",
            "1",
        ]
        collector = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        assert collector.stderr is not None
        # Non-TTY progress: one line per finished group. Kill after the first one.
        for line in collector.stderr:
            if line.startswith("groups 1/"):
                collector.send_signal(signal.SIGKILL)
                break
        collector.wait(timeout=20)
        collector.stderr.close()
        assert collector.returncode == -signal.SIGKILL
        done_before = {r["_ng_group_key"] for r in map(json.loads, out.read_text().splitlines())}
        assert 1 <= len(done_before) < GROUPS
        resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=60)
        stats = judge_stats(url)
    assert resumed.returncode == 0, resumed.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 4 * GROUPS
    assert len({r["_ng_group_key"] for r in results}) == GROUPS
    assert len({(r["_ng_group_key"], r["_ng_rollout_index"]) for r in results}) == 4 * GROUPS
    # Every pair of every group was judged exactly once across both runs: the completed
    # groups were skipped, the one in flight at the kill reattached or replayed.
    assert stats["total"] == 4 * GROUPS
    assert set(stats["pairs"].values()) == {1}
    metrics = json.loads((tmp_path / "results.metrics.json").read_text())
    assert metrics["this_run"]["groups_skipped_complete"] == len(done_before)
    assert metrics["usable_rewards"] == 4 * GROUPS
