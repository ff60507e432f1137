"""The real executables: server and fake judge as subprocesses on loopback, real gRPC."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient

from genrm_grpc.demo import running_stack

pytestmark = pytest.mark.e2e

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
ANSWERS = ["Seven is a prime number.", "Four.", "Two is the only even prime number.", ""]


async def _exercise(target: str) -> tuple[pb.CompareResponse, list[pb.StreamGroupsResponse]]:
    async with CohortClient(target) as client:
        compared = await client.compare(
            PROMPT, [pb.Candidate(output_text=a) for a in ANSWERS], timeout=30
        )
        requests = [
            pb.SubmitMemberRequest(
                member=pb.MemberRef(group_id="e2e", group_attempt=0, rollout_index=k),
                prompt=PROMPT,
                candidate=pb.Candidate(output_text=a),
            )
            for k, a in enumerate(ANSWERS)
        ]
        events = [e async for e in client.stream_groups(requests, timeout=30)]
    return compared, events


def test_server_and_fake_judge_processes_serve_compare_and_stream_groups() -> None:
    with running_stack() as (_url, target):
        compared, events = asyncio.run(_exercise(target))
        health = subprocess.run(
            [sys.executable, "-m", "genrm_grpc.cli", "health", "--target", target],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert len(compared.rewards) == 4
    assert compared.rewards[3] == min(compared.rewards)
    results = [e.result for e in events if e.WhichOneof("event") == "result"]
    assert sorted(r.member.rollout_index for r in results) == [0, 1, 2, 3]
    assert health.returncode == 0 and "SERVING" in health.stdout


def test_server_stops_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("genrm-grpc serving on")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert proc.stderr is not None
    assert '"msg": "stopped"' in proc.stderr.read()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--cohort-collection-timeout-s", "0"], "cohort_collection_timeout_s"),
        (["--judge-request-timeout-s", "inf"], "judge_request_timeout_s"),
        (["--num-rollouts-per-prompt", "0"], "num_rollouts_per_prompt"),
        (["--listen", "nowhere"], "listen"),
    ],
)
def test_invalid_configuration_is_one_clear_line_and_exit_code_2(
    flags: list[str], needle: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "invalid configuration" in lines[0]
