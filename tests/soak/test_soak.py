"""The soak in miniature (100 groups × 8 members): the same checks as ``make soak``."""

from __future__ import annotations

from .driver import SoakConfig, run_soak


async def test_small_soak_gives_every_member_one_outcome_of_its_class_and_leaks_nothing() -> None:
    cfg = SoakConfig(
        groups=100,
        size=8,
        wave=25,
        warmup_waves=2,
        concurrency=25,
        # Long enough that a member delayed by a loaded CI machine still arrives in time;
        # the "never" scenario waits this long once per wave.
        collection_timeout_s=6.0,
        max_terminal_cohorts=32,
    )
    report = await run_soak(cfg)
    assert report.failures() == [], report.summary()
    # The mix really happened: every scenario ran, and the faulty waves masked a group
    # or at least made the judge fail some requests.
    assert set(report.scenarios) == {
        "normal",
        "duplicates",
        "cancel",
        "conflict",
        "supersede",
        "never",
    }
    assert report.rewarded_groups > 0 and report.failed_groups > 0
    assert sum(n for k, n in report.judge_outcomes.items() if k != "ok") > 0
