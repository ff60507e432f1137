"""Every command in docs/runbook.md's `console` blocks runs against a live server.

The server and the fake judge run as subprocesses (as in production), with bearer-token
auth and a metrics endpoint. Commands run in document order in bash with ADDR, METRICS
and TOKEN set and the venv's bin (grpcurl, genrm-grpc) first on PATH; stdout and stderr
are compared with the output shown in the runbook, where `...` matches any text.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
VENV_BIN = pathlib.Path(sys.executable).parent
TOKEN = "runbook-token-7f3a"

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Step:
    line: int
    command: str
    expected: str


def runbook_steps(text: str) -> list[Step]:
    """The `$ command` lines of every ```console block, each with the output below it."""
    steps: list[Step] = []
    in_block = False
    current: tuple[int, str] | None = None
    output: list[str] = []

    def flush() -> None:
        nonlocal current, output
        if current is not None:
            steps.append(Step(current[0], current[1], "\n".join(output)))
        current, output = None, []

    for number, line in enumerate(text.splitlines(), start=1):
        if not in_block:
            in_block = line.strip() == "```console"
            continue
        if line.strip() == "```":
            flush()
            in_block = False
        elif line.startswith("$ "):
            flush()
            current = (number, line[2:])
        else:
            output.append(line)
    return steps


def matches(expected: str, actual: str) -> bool:
    pattern = re.escape(expected.strip()).replace(re.escape("..."), ".*?")
    lines = [line.rstrip() for line in actual.strip().splitlines()]
    return re.fullmatch(pattern, "\n".join(lines), flags=re.DOTALL) is not None


def test_runbook_has_commands_for_each_topic() -> None:
    commands = " ".join(step.command for step in runbook_steps(RUNBOOK.read_text()))
    for topic in ("health", "list", "describe", "Compare", "SubmitMember", "GetCohort"):
        assert topic in commands
    assert "-format-error" in commands and "/metrics" in commands


def test_matching_treats_dots_as_any_text_and_nothing_else() -> None:
    assert matches('{\n  "a": ...\n}', '{\n  "a": 1.5\n}')
    assert not matches('{\n  "a": 1\n}', '{\n  "a": 2\n}')
    assert not matches("a.b", "axb")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start(args: list[str], ready: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(ready):
        proc.kill()
        raise RuntimeError(f"{args} did not start: {line!r}")
    return proc, line[len(ready) :].strip()


@pytest.fixture
def live_server(tmp_path: pathlib.Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    cli = [sys.executable, "-m", "genrm_grpc.cli"]
    judge, judge_url = _start([*cli, "fake-judge", "--port", "0"], "fake-judge listening on", env)
    metrics = f"127.0.0.1:{_free_port()}"
    config = tmp_path / "server.yaml"
    config.write_text(
        f'listen: "127.0.0.1:0"\nmetrics_listen: "{metrics}"\n'
        f"judge: {{url: {judge_url}}}\nauth: {{tokens_env: RUNBOOK_TOKENS}}\n"
        "log_level: WARNING\n"
    )
    server = None
    try:
        server, addr = _start(
            [*cli, "serve", "--config", str(config)],
            "genrm-grpc serving on",
            {**env, "RUNBOOK_TOKENS": TOKEN},
        )
        yield {**env, "ADDR": addr, "METRICS": metrics, "TOKEN": TOKEN}
    finally:
        for proc in (server, judge):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


def test_every_runbook_command_gives_the_documented_output(live_server: dict[str, str]) -> None:
    assert shutil.which("grpcurl", path=live_server["PATH"]), "grpcurl missing from the venv"
    steps = runbook_steps(RUNBOOK.read_text())
    assert len(steps) >= 10
    for step in steps:
        done = subprocess.run(
            ["bash", "-c", f"{step.command} 2>&1"],
            capture_output=True,
            text=True,
            env=live_server,
            cwd=ROOT,
            timeout=60,
        )
        assert matches(step.expected, done.stdout), (
            f"docs/runbook.md line {step.line}: `{step.command}`\n"
            f"--- documented ---\n{step.expected}\n--- actual ---\n{done.stdout}"
        )
