"""Open files: ``serve`` raises its soft RLIMIT_NOFILE to the hard limit, refuses a
configuration whose judge connections cannot fit (one line, exit 2), and a listener out
of descriptors does not flood the log. Real ``genrm-grpc serve`` processes started under
util-linux's ``prlimit`` with the limits to test, the fake judge process on loopback.

(Not ``preexec_fn``: Python code run between fork and exec in this test process, which
holds gRPC's threads by then, once aborted the child before its exec.)"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from genrm_grpc.logs import RepeatCollapser
from tests.e2e.support import until
from tests.judge.processes import PY, FakeJudgeProcess, free_port

pytestmark = pytest.mark.e2e

FLOOD = "socket.accept() out of system resource"


def _soft_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


@pytest.fixture
def judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess() as process:
        yield process


def _serve(
    judge: FakeJudgeProcess, tmp_path: Path, soft: int, hard: int, **env: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "prlimit",
            f"--nofile={soft}:{hard}",
            *PY,
            "serve",
            "--listen",
            f"127.0.0.1:{free_port()}",
        ],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "server.log").open("w"),
        text=True,
        env={
            **os.environ,
            "GENRM_STORE": f"sqlite:///{tmp_path / 'cohorts.db'}",
            "GENRM_JUDGE__URL": judge.url,
            **env,
        },
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def test_serve_raises_its_soft_open_files_limit_to_the_hard_limit(
    judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    proc = _serve(judge, tmp_path, 512, 4096)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("genrm-grpc serving on")
        assert _soft_limit_of(proc.pid) == 4096
    finally:
        _stop(proc)
    records = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines()]
    raised = [r for r in records if r["msg"] == "raised the open-files limit"]
    assert [(r["rlimit_nofile_before"], r["rlimit_nofile"]) for r in raised] == [(512, 4096)]


def test_judge_connections_that_cannot_fit_the_limit_are_refused_in_one_line(
    judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    proc = _serve(judge, tmp_path, 512, 512, GENRM_JUDGE__MAX_CONNECTIONS="2048")
    assert proc.wait(timeout=60) == 2
    lines = (tmp_path / "server.log").read_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert "judge.max_connections (2048)" in lines[0]
    assert "RLIMIT_NOFILE allows 512 (hard limit 512)" in lines[0]


def test_a_listener_out_of_descriptors_logs_it_once_not_once_a_second(
    judge: FakeJudgeProcess, tmp_path: Path
) -> None:
    metrics = free_port()
    proc = _serve(
        judge,
        tmp_path,
        300,
        300,
        GENRM_JUDGE__MAX_CONNECTIONS="4",
        GENRM_METRICS_LISTEN=f"127.0.0.1:{metrics}",
    )
    held: list[socket.socket] = []
    log = tmp_path / "server.log"
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("genrm-grpc serving on")
        # More connections than the server has descriptors for, until its accept loop
        # meets EMFILE (a busy machine may time some connects out first: keep going).
        for _ in range(600):
            if FLOOD in log.read_text():
                break
            try:
                held.append(socket.create_connection(("127.0.0.1", metrics), timeout=1))
            except OSError:  # the listen backlog is full for now
                continue
        until(lambda: FLOOD in log.read_text(), timeout=30)
        # asyncio retries the accept every second: without the collapse, one record each.
        time.sleep(4)
        floods = log.read_text().count(FLOOD)
    finally:
        for sock in held:
            sock.close()
        _stop(proc)
    assert floods == 1


def test_repeats_of_one_record_are_dropped_and_counted_until_the_interval_ends() -> None:
    now = [0.0]
    collapse = RepeatCollapser(interval_s=60, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    assert collapse.filter(record(FLOOD))
    passed = [collapse.filter(record(FLOOD)) for _ in range(999)]
    assert not any(passed)
    assert collapse.filter(record("another message"))  # other kinds are not held back
    now[0] = 60.0
    after = record(FLOOD)
    assert collapse.filter(after)
    assert after.getMessage() == f"{FLOOD} (and 999 more like it in the last 60 s, not logged)"
    assert not collapse.filter(record(FLOOD))
