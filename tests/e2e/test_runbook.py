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


def _start_section() -> tuple[str, str]:
    """The runbook's server.yaml and its `GENRM_TOKENS=... serve` command."""
    text = RUNBOOK.read_text()
    section = text.split("## Start and stop", 1)[1].split("\n## ", 1)[0]
    config = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    command = next(
        line for line in section.splitlines() if line.startswith("GENRM_TOKENS=... genrm-grpc")
    )
    return config, command


def _loopback(config: str) -> str:
    """The runbook's file with loopback ports instead of the production addresses."""
    config = config.replace('"0.0.0.0:50051"', '"127.0.0.1:0"')
    return config.replace('"0.0.0.0:9464"', f'"127.0.0.1:{_free_port()}"')


def _run_start_command(command: str, config: pathlib.Path, token: str) -> subprocess.Popen[str]:
    # As an operator runs it: no GENRM_* but the command's own, so the store is the
    # default file in the working directory (the test's directory, not the checkout).
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GENRM_")}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    line = command.replace("GENRM_TOKENS=...", f"GENRM_TOKENS={token}")
    line = line.replace("/etc/genrm/server.yaml", str(config))
    return subprocess.Popen(
        ["bash", "-c", line],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=config.parent,
    )


def test_the_start_command_and_file_of_the_runbook_start_a_server_with_auth(
    tmp_path: pathlib.Path,
) -> None:
    config_text, command = _start_section()
    assert "tokens_env: GENRM_TOKENS" in config_text
    config = tmp_path / "server.yaml"
    config.write_text(_loopback(config_text))
    proc = _run_start_command(command, config, TOKEN)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("genrm-grpc serving on 127.0.0.1:"), ready
        addr = ready.split()[-1]
        listed = subprocess.run(
            [str(VENV_BIN / "grpcurl"), "-plaintext", addr, "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Unauthenticated" in listed.stdout + listed.stderr  # the tokens are in force
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_start_command_without_the_auth_block_is_refused_not_served_open(
    tmp_path: pathlib.Path,
) -> None:
    config_text, command = _start_section()
    config = tmp_path / "server.yaml"
    config.write_text(_loopback(config_text.split("auth:", 1)[0]))
    proc = _run_start_command(command, config, TOKEN)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert err.strip() == (
        "genrm-grpc: invalid configuration: unknown environment variable GENRM_TOKENS "
        "(settings are GENRM_<KEY> and GENRM_<BLOCK>__<KEY>; a variable holding a secret "
        "must be named by judge.api_key_env or auth.tokens_env)"
    )
