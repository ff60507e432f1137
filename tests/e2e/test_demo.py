"""``make demo`` end to end, and its restart act on its own (real processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from genrm_grpc.demo_restart import restart_act

pytestmark = pytest.mark.e2e


def test_the_restart_act_judges_only_the_passes_missing_from_the_journal(
    tmp_path: Path,
) -> None:
    report = restart_act(tmp_path, judge_latency_ms=300)
    journaled = len(report.journaled)
    assert journaled >= 2  # the kill came after the store held verdicts
    assert set(report.killed_calls) == {"UNAVAILABLE"}  # the callers saw the crash
    assert report.requests_after_restart == report.passes - journaled
    assert set(report.resumed) == {journaled}
    assert not any(report.masked)
    assert report.requests_on_resend == 0
    assert all(report.replayed)


def test_make_demo_runs_end_to_end_and_leaves_nothing_in_the_working_directory(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the identical resend after completion: replayed, 0 new judge requests" in done.stdout
    assert list(tmp_path.iterdir()) == []
