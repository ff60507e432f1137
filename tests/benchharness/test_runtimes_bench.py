"""The two-runtimes bench runs end to end in its smallest form, so its harness cannot
rot: two servers per case (identical but for ``runtime``), the instant judge, the load
generator. What is checked is the bookkeeping (every side measured in every round, the
judge calls each side made, the ratio's rounds), never a timing."""

from __future__ import annotations

import pathlib

from bench.runtimes import RuntimesPlan, markdown, run


def test_both_runtimes_are_measured_in_the_same_rounds_with_the_same_judge_calls(
    tmp_path: pathlib.Path,
) -> None:
    plan = RuntimesPlan(
        rounds=2,
        groups=3,
        in_flight=3,
        single_groups=40,
        single_in_flight=8,
        warmup_groups=1,
        stores=("memory",),
        sizes=(16, 1),
    )
    result = run(plan, tmp_path)
    assert list(result["cases"]) == ["16-memory", "1-memory"]
    for name, calls_per_member in (("16-memory", 1.0), ("1-memory", 0.0)):
        case = result["cases"][name]
        assert case["sides"] == ["groups", "registry"]
        for api in ("SubmitMember", "StreamGroups"):
            summary = case["summary"][api]
            assert len(summary["ratio"]["rounds"]) == 2
            for side in ("groups", "registry"):
                # circular pairs: one judge call per member of a 16-member group.
                assert summary[side]["judge_calls_per_member"]["median"] == calls_per_member
                assert summary[side]["masked"] == 0
    text = markdown(result)
    assert "### 16-member groups, memory" in text and "groups / registry" in text
