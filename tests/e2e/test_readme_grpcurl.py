"""The README's grpcurl block runs as written against a live server and fake judge."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.test_runbook import ROOT, VENV_BIN, _start

pytestmark = pytest.mark.e2e


def readme_grpcurl_block() -> str:
    section = (ROOT / "README.md").read_text().split("\n## grpcurl\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0]


@pytest.fixture
def open_server(tmp_path: pathlib.Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    cli = [sys.executable, "-m", "genrm_grpc.cli"]
    judge, judge_url = _start([*cli, "fake-judge", "--port", "0"], "fake-judge listening on", env)
    config = tmp_path / "server.yaml"
    config.write_text(f'listen: "127.0.0.1:0"\njudge: {{url: {judge_url}}}\nlog_level: WARNING\n')
    server = None
    try:
        server, addr = _start(
            [*cli, "serve", "--config", str(config), "--store", "memory://"],
            "genrm-grpc serving on",
            env,
        )
        yield {**env, "ADDR": addr}
    finally:
        for proc in (server, judge):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


def test_the_readme_grpcurl_block_completes_its_group_instead_of_waiting_for_the_deadline(
    open_server: dict[str, str],
) -> None:
    script = readme_grpcurl_block().replace("localhost:50051", "$ADDR")
    # A member of an incomplete group would block for the 30 min collection deadline.
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=open_server,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # grpcurl prints one JSON object per call; the two members' results carry rewards.
    rewards = re.findall(r'"reward": ([0-9.]+)', done.stdout)
    assert len(rewards) == 2, done.stdout
    # The GetCohort at the end describes the finished group.
    assert '"phase": "COHORT_PHASE_COMPLETED"' in done.stdout.rsplit('"reward"', 1)[1]
