"""``--log-format text`` keeps the structured fields (cohort key, reason) in the line."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError

from genrm_grpc.logs import TextFormatter

pytestmark = pytest.mark.e2e


async def _submit_half_a_group(target: str) -> CohortError:
    member = pb.MemberRef(group_id="logs-1", group_attempt=0, rollout_index=0, group_size=2)
    async with CohortClient(target) as client:
        with pytest.raises(CohortError) as caught:
            await client.submit_member(member, "ping", "pong", timeout=60)
    return caught.value


def test_text_log_lines_of_a_served_cohort_carry_its_key_and_reason() -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", "127.0.0.1:0"),
            *("--log-format", "text", "--cohort-collection-timeout-s", "0.5"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("genrm-grpc serving on"), ready
        error = asyncio.run(_submit_half_a_group(ready.split()[-1]))
        assert error.code == grpc.StatusCode.ABORTED
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    lines = stderr.splitlines()
    serving = next(line for line in lines if " serving " in line + " ")
    assert " port=" in serving and " auth=off" in serving
    failed = next(line for line in lines if "cohort failed" in line)
    assert " WARNING genrm_grpc.runtime.engine: cohort failed " in failed
    assert " cohort=g:logs-1#0 " in failed and " outcome=failed " in failed
    assert ' reason="collection deadline expired' in failed
    assert not any(line.lstrip().startswith("{") for line in lines)  # text, not JSON


def test_text_fields_are_bare_words_or_quoted_strings() -> None:
    record = logging.LogRecord("genrm", logging.INFO, __file__, 1, "done", None, None)
    record.__dict__.update(
        {"cohort": "g:a#0", "n": 3, "reason": 'said "no" = twice', "missing": [0, 2], "e": ""}
    )
    line = TextFormatter().format(record)
    assert line.endswith(
        ' INFO genrm: done cohort=g:a#0 n=3 reason="said \\"no\\" = twice" missing="[0, 2]" e=""'
    )
