"""The judge-tokens bench runs end to end in its smallest form, so its harness cannot rot:
two fake-judge nodes with the bimodal length model, a server per run, the load generator.
What is checked is the bookkeeping (the nodes, the server's metrics and the groups' own
metrics agree), never a timing."""

from __future__ import annotations

import pathlib

import pytest

from bench.tokens import (
    MODES,
    QUICK,
    TokensPlan,
    budget_for_saving,
    ideal_saving,
    ideal_tokens_per_verdict,
    markdown,
    model_tokens_per_verdict,
    run,
)


def test_the_ideal_saving_of_the_model_is_the_issues_figure() -> None:
    # A cap at the longest converged length (10,000): 25 % at 16,384, 67 % at 49,152.
    plan = TokensPlan()
    assert ideal_saving(plan, 16384) == pytest.approx(0.25, abs=0.005)
    assert ideal_saving(plan, 49152) == pytest.approx(0.67, abs=0.005)


def test_the_budget_a_saving_needs_inverts_the_model_of_the_adaptive_budget() -> None:
    plan = TokensPlan()
    for cap in (16384, 49152):
        need = budget_for_saving(plan, cap, 0.8 * ideal_saving(plan, cap))
        saving = 1 - model_tokens_per_verdict(plan, need, cap) / ideal_tokens_per_verdict(plan, cap)
        assert saving == pytest.approx(0.8 * ideal_saving(plan, cap))
    # A budget equal to the cap saves nothing.
    assert model_tokens_per_verdict(plan, 16384, 16384) == pytest.approx(
        ideal_tokens_per_verdict(plan, 16384)
    )


def test_the_quick_tokens_bench_counts_every_token_once(tmp_path: pathlib.Path) -> None:
    result = run(QUICK, tmp_path)
    runs = result["runs"]
    assert {(r["cap"], r["mode"]) for r in runs} == {
        (cap, mode) for cap in QUICK.budgets for mode in MODES
    }
    for r in runs:
        key = (r["cap"], r["mode"])
        assert r["errors"] == 0, key
        assert r["members"] == QUICK.groups * QUICK.size, key
        assert r["comparisons"] == QUICK.groups * QUICK.size, key  # circular: one per member
        # The server's verdict histogram counts the comparisons that ended "ok".
        assert r["server_verdicts_histogram"] == r["verdicts"] > 0, key
        # Every token the nodes generated and answered is in the server's ledger (verdicts
        # + wasted); only requests aborted mid-generation add tokens the server never saw.
        ledger = r["server_verdict_tokens"] + r["server_wasted_tokens"]
        if r["node_aborted"] == 0:
            assert r["node_generation_tokens"] == ledger, key
        else:
            assert r["node_generation_tokens"] >= ledger, key
        # Groups carry no more than the server counted in the step.
        assert r["group_output_tokens"] <= ledger, key
        assert r["groups_with_metrics"] == QUICK.groups, key
        if r["mode"] == "off":
            # Every runaway ran to the configured cap and was wasted whole.
            assert r["budget_after_warmup"] is None and r["adaptive_cuts"] == 0, key
            assert r["server_wasted_tokens"] == r["node_finished_length"] * r["cap"], key
        else:
            # The warm-up taught the budget: below the cap, above the longest converged.
            budget = r["budget_after_warmup"]
            assert budget is not None, key
            assert QUICK.converge_tokens + QUICK.jitter_tokens <= budget < r["cap"], key
            assert 0 < r["adaptive_cuts"] <= r["node_finished_length"], key
            assert r["server_wasted_tokens"] <= r["node_finished_length"] * r["cap"], key
    text = markdown(result)
    assert "simulated" in text.lower()
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| 16,384") or line.startswith("| 49,152")
    ]
    assert len(rows) == 2 * 2 * len(MODES)  # the main table and the profile
    main_rows = [row for row in rows if row.count("|") == 11]
    assert len(main_rows) == 2 * len(MODES)
    assert all(("✔" in row) or ("✘" in row) for row in main_rows if "| on |" in row)
