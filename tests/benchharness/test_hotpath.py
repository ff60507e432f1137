"""bench.hotpath (run by hand, not in make bench) still drives the servicer end to end:
it broke once, unnoticed, when SubmitMember started sending initial metadata."""

from __future__ import annotations

import json

import pytest

from bench import hotpath


def test_every_hotpath_case_runs_and_reports_a_cost_per_member(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert hotpath.main(["--members", "32", "--repeats", "1"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figures) == set(hotpath.CASES)
    assert all(value > 0 for value in figures.values())
