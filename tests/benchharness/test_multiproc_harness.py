"""A small run of the multi-process benchmark harness (`make bench`) end to end.

Real processes: `genrm-grpc serve`, the bench judge, the baseline and the load generator.
It checks what the figures rest on, not the figures: the baseline does the service's
judge work (the same bodies, as many calls) and the judge's in-flight gauge holds the
concurrency bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.multiproc import MultiPlan, run_multi

pytestmark = pytest.mark.e2e

PLAN = MultiPlan(
    rounds=1,
    group_size=4,
    in_flight=2,
    groups=4,
    warmup_groups=1,
    concurrency=8,
    answer_bytes=256,
    sat_levels=(4,),
    sat_latency_ms=200.0,
    sat_rounds=1,
    sat_warmup_s=0.3,
    sat_window_s=0.6,
    sections=("throughput", "saturation"),
)


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    out: dict[str, Any] = {}
    run_multi(PLAN, out)
    return out


def test_the_baseline_sends_the_judge_the_same_bodies_as_the_service(
    results: dict[str, Any],
) -> None:
    bodies = results["throughput"]["bodies"]
    assert bodies["identical"]
    assert bodies["service_requests"] == bodies["baseline_requests"] == PLAN.group_size


def test_both_sides_make_one_judge_call_per_member_and_nothing_is_masked(
    results: dict[str, Any],
) -> None:
    summary = results["throughput"]["summary"]
    for api in ("SubmitMember", "StreamGroups"):
        for side in ("service", "baseline"):
            assert summary[api][side]["judge_calls_per_member"]["median"] == 1.0  # circular
            assert summary[api][side]["masked"] == 0
        assert summary[api]["ratio"]["median"] > 0


def test_the_judge_never_sees_more_than_c_in_flight_and_the_baseline_reaches_c(
    results: dict[str, Any],
) -> None:
    summary = results["saturation"]["summary"]
    assert 1 <= summary["service-4"]["max_in_flight"] <= 4
    # 3·C pairs are offered and each takes 200 ms: the bare baseline fills its bound.
    assert summary["baseline-4"]["max_in_flight"] == 4
    assert summary["service-4"]["pairs_per_s"]["median"] > 0


STORE_PLAN = MultiPlan(
    rounds=1,
    group_size=4,
    in_flight=2,
    groups=3,
    warmup_groups=1,
    concurrency=8,
    answer_bytes=256,
    store_retained=50,
    store_active=2,
    store_restarts=1,
    sections=("store",),
)


@pytest.fixture(scope="module")
def store_results() -> dict[str, Any]:
    out: dict[str, Any] = {}
    run_multi(STORE_PLAN, out)
    return out["store"]


def test_the_store_section_runs_a_sqlite_and_a_memory_server_on_the_same_work(
    store_results: dict[str, Any],
) -> None:
    assert store_results["sides"] == ["sqlite", "memory"]
    for api in ("SubmitMember", "StreamGroups"):
        for side in ("sqlite", "memory"):
            assert store_results["summary"][api][side]["judge_calls_per_member"]["median"] == 1.0
            assert store_results["summary"][api][side]["masked"] == 0
    # The SQLite server really wrote its file: every group run (warm-up + timed) retained.
    groups = 2 * STORE_PLAN.warmup_groups + 2 * STORE_PLAN.rounds * STORE_PLAN.groups
    served = store_results["served_file"]["rows"]
    assert served["tombstones"] == groups
    assert served["verdicts"] == groups * STORE_PLAN.group_size  # circular: one per member
    assert served["members"] == served["cohorts"] == 0


def test_the_restart_reads_back_the_active_cohorts_of_a_full_store_and_nothing_of_an_empty_one(
    store_results: dict[str, Any],
) -> None:
    rec = store_results["recovery"]
    by_side = {r["side"]: r for r in rec["restarts"]}
    assert (by_side["full"]["answer"], by_side["full"]["members"]) == (
        "COHORT_PHASE_COLLECTING",
        16,
    )
    assert by_side["empty"]["answer"] == "NOT_FOUND"
    for row in rec["restarts"]:
        assert 0 < row["serving_s"] <= row["first_get_cohort_s"]
    assert rec["size"]["rows"]["tombstones"] == STORE_PLAN.store_retained
    assert rec["size"]["bytes_per_retained_cohort"] > 0
