"""The `single` section of `make bench`, small: the service on `memory://` and on the
default store (a SQLite file) against the bare echo, in the same rounds, and the
targets table reading both figures."""

from __future__ import annotations

from typing import Any

import pytest

from bench.mpreport import TARGETS, target_rows
from bench.multiproc import MultiPlan, run_multi

pytestmark = pytest.mark.e2e

PLAN = MultiPlan(
    rounds=2,
    warmup_groups=1,
    concurrency=8,
    answer_bytes=256,
    single_groups=40,
    single_in_flight=8,
    sections=("single",),
)


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    out: dict[str, Any] = {"multi_plan": {}}
    run_multi(PLAN, out)
    return out


def test_the_three_sides_run_in_every_round_the_order_reversed_every_other(
    results: dict[str, Any],
) -> None:
    single = results["single"]
    assert single["sides"] == ["service", "service-sqlite", "echo"]
    order = [
        [r["side"] for r in single["runs"] if r["round"] == rnd and r["api"] == "SubmitMember"]
        for rnd in range(PLAN.rounds)
    ]
    assert order == [single["sides"], single["sides"][::-1]]
    for api in ("SubmitMember", "StreamGroups"):
        ratios = single["summary"][api]["ratios"]
        assert set(ratios) == {"service", "service-sqlite"}
        assert single["summary"][api]["ratio"] == ratios["service"]
        for side in ("service", "service-sqlite"):
            assert len(ratios[side]["rounds"]) == PLAN.rounds
            assert all(r > 0 for r in ratios[side]["rounds"])
            assert single["summary"][api][side]["masked"] == 0
    # The SQLite side wrote its file: a tombstone for every group it was sent.
    groups = PLAN.warmup_groups * 8 * 2 + PLAN.rounds * 2 * PLAN.single_groups
    assert single["served_file"]["rows"]["tombstones"] == groups


def test_the_targets_table_reads_the_default_store_figure_against_its_own_target(
    results: dict[str, Any],
) -> None:
    rows = {row[0]: row for row in target_rows(results)}
    name = (
        "1-member groups, SubmitMember on the default store (SQLite) ≥ "
        f"{TARGETS['single_sqlite']}× a bare echo"
    )
    figure = results["single"]["summary"]["SubmitMember"]["ratios"]["service-sqlite"]
    assert rows[name][1].startswith(f"{figure['median']:.2f}×")
    assert rows[name][2].startswith("✔" if figure["median"] >= 0.5 else "✘")
    assert "1-member groups, SubmitMember ≥ 0.6× a bare echo" in rows
