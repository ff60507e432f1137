"""Every page that describes a stop points to the one statement instead of restating it."""

from __future__ import annotations

import pytest

from .stop_statement import ANCHOR, ROOT, documented_waiter_reason, stop_section

# The pages that tell an operator about SIGTERM; each must defer to the one statement.
PAGES = ["README.md", "docs/runbook.md", "docs/deploy.md", "docs/scaling.md"]

# What these pages used to say for every store, which is only true of memory://.
RESTATEMENTS = ["everything else fails", "fails what is left", "everything else fail"]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_that_describes_the_drain_links_to_the_one_stop_statement(page: str) -> None:
    text = (ROOT / page).read_text()
    assert ANCHOR in text.replace("docs/durability.md", "durability.md")
    assert not [phrase for phrase in RESTATEMENTS if phrase in text]


def test_the_stop_statement_names_a_waiter_outcome_for_every_store() -> None:
    assert "shutdown_grace_s" in stop_section()
    assert documented_waiter_reason("sqlite") == "SHUTTING_DOWN"
    assert documented_waiter_reason("redis") == "SHUTTING_DOWN"
    assert documented_waiter_reason("memory") == "COHORT_FAILED"
