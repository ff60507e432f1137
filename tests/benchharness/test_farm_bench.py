"""The judge-farm bench runs end to end in its smallest form, so its harness cannot rot:
four farm-node processes, a server per run, the load generator, a node that hangs."""

from __future__ import annotations

import pathlib

from bench.farm import QUICK, findings, markdown, run
from bench.mpreport import write_section


def test_the_quick_farm_bench_measures_every_variant_and_the_sick_node(
    tmp_path: pathlib.Path,
) -> None:
    result = run(QUICK, tmp_path)
    summary = result["summary"]
    assert set(summary) == {*QUICK.variants, "sick"}
    for key, row in summary.items():
        assert row["ratio"]["median"] >= 0.95, key  # never below the lower bound
        assert row["masked"]["max"] == 0, key
    assert summary["affinity"]["requests_per_pass"]["median"] == 1.0
    text = markdown(result)
    assert "this service, one node hangs mid-run" in text and "simulated" in text.lower()
    words = findings(result)
    sick = summary["sick"]
    assert f"{sick['masked']['max']:.0f} members masked" in words
    assert "judge-farm.md#what-the-farm-bench-shows" in words


def test_the_section_replaces_itself_in_the_page() -> None:
    page = "# Performance\n\nintro\n\n## Reproduce\n\nmake bench\n"
    once = write_section(page, "judge-farm", "## Judge farm\n\nfigures 1")
    assert once.index("figures 1") < once.index("## Reproduce")
    twice = write_section(once, "judge-farm", "## Judge farm\n\nfigures 2")
    assert "figures 1" not in twice and twice.count("BEGIN KEPT SECTION: judge-farm") == 1
