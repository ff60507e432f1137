"""collect against an address where nothing listens: says so within its connect deadline."""

from __future__ import annotations

import json
import os
import pty
import select
import socket
import subprocess
from pathlib import Path

import pytest

from tests.client.support import gym_rows
from tests.collect.test_collect_processes import PY, process

pytestmark = pytest.mark.e2e


def _rollouts(tmp_path: Path) -> Path:
    rows = gym_rows("Name a prime number.", ["Seven.", "Four.", "Two is prime."], task_index=0)
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return source


def _refusing_port() -> socket.socket:
    """A port that is bound (so nobody else takes it) but not listening: refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def test_collect_fails_fast_with_connecting_then_cannot_connect(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    with _refusing_port() as sock:
        server = f"127.0.0.1:{sock.getsockname()[1]}"
        done = subprocess.run(
            [
                *PY,
                "collect",
                "--server",
                server,
                "--input",
                str(_rollouts(tmp_path)),
                "--output",
                str(out),
                "--connect-timeout-s",
                "1",
                "--progress",
            ],
            capture_output=True,
            text=True,
            timeout=120,  # far below the 3600 s group deadline the old code waited for
        )
    assert done.returncode == 3, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"connecting to {server}…"
    assert lines[-1].startswith(f"genrm-grpc collect: cannot connect to {server} within 1 s: ")
    assert "Connection refused" in lines[-1] and "--wait-for-server" in lines[-1]
    assert "DEADLINE_EXCEEDED" not in done.stderr
    assert list(tmp_path.glob("results*")) == []  # the next run needs no --overwrite


def test_collect_on_a_terminal_keeps_the_connecting_line_moving(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    with _refusing_port() as sock:
        server = f"127.0.0.1:{sock.getsockname()[1]}"
        proc = subprocess.Popen(
            [
                *PY,
                "collect",
                "--server",
                server,
                "--input",
                str(_rollouts(tmp_path)),
                "--output",
                str(tmp_path / "results.jsonl"),
                "--connect-timeout-s",
                "5",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
        os.close(slave)
        screen = b""
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            screen += chunk
        os.close(master)
        assert proc.wait(timeout=120) == 3
    text = screen.decode()
    frames = [f for f in text.split("\r\x1b[2K") if f.startswith(f"connecting to {server}…")]
    # Redrawn while waiting (the elapsed time moves), not a frozen counter line.
    assert len(frames) >= 2 and len(set(frames)) == len(frames), text
    assert "groups 0/" not in text
    assert f"cannot connect to {server} within 5 s" in text


def test_collect_with_wait_for_server_waits_for_a_server_that_starts_later(
    tmp_path: Path,
) -> None:
    out = tmp_path / "results.jsonl"
    sock = _refusing_port()
    port = sock.getsockname()[1]
    collect = subprocess.Popen(
        [
            *PY,
            "collect",
            "--server",
            f"127.0.0.1:{port}",
            "--input",
            str(_rollouts(tmp_path)),
            "--output",
            str(out),
            "--wait-for-server",
            "--progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert collect.stderr is not None
        assert collect.stderr.readline() == f"connecting to 127.0.0.1:{port}…\n"
        sock.close()  # free the port for the server
        with (
            process([*PY, "fake-judge", "--port", "0"], "fake-judge listening on") as url,
            process(
                [*PY, "serve", "--listen", f"127.0.0.1:{port}", "--judge-url", url],
                "genrm-grpc serving on",
            ),
        ):
            assert collect.wait(timeout=300) == 0, collect.stderr.read()
    finally:
        if collect.poll() is None:
            collect.kill()
            collect.wait()
        if collect.stderr is not None:
            collect.stderr.close()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 3 and all(isinstance(r["reward"], float) for r in results)


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_collect_refuses_a_connect_timeout_that_is_not_a_positive_number(
    tmp_path: Path, value: str
) -> None:
    done = subprocess.run(
        [
            *PY,
            "collect",
            "--server",
            "127.0.0.1:1",
            "--input",
            str(_rollouts(tmp_path)),
            "--output",
            str(tmp_path / "results.jsonl"),
            "--connect-timeout-s",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "genrm-grpc collect: --connect-timeout-s must be > 0"


def test_resuming_a_finished_run_needs_no_server(tmp_path: Path) -> None:
    source, out = _rollouts(tmp_path), tmp_path / "results.jsonl"
    argv = ["collect", "--input", str(source), "--output", str(out), "--connect-timeout-s", "1"]
    with (
        process([*PY, "fake-judge", "--port", "0"], "fake-judge listening on") as url,
        process(
            [*PY, "serve", "--listen", "127.0.0.1:0", "--judge-url", url], "genrm-grpc serving on"
        ) as target,
    ):
        first = subprocess.run(
            [*PY, *argv, "--server", target], capture_output=True, text=True, timeout=300
        )
    assert first.returncode == 0, first.stderr
    with _refusing_port() as sock:
        again = subprocess.run(
            [*PY, *argv, "--server", f"127.0.0.1:{sock.getsockname()[1]}", "--resume"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert again.returncode == 0, again.stderr
    assert "resume: 1 group(s) already complete" in again.stderr
    assert "connecting" not in again.stderr
