"""The one statement of what a stop does (docs/durability.md, *What a stop does*), read as data.

The drain tests take their expected status from this table, so the page and the server
cannot drift apart; the pages that mention a stop link to it instead of restating it.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "durability.md"
ANCHOR = "durability.md#what-a-stop-does"

# A store's row: `sqlite:///…`, `redis://…`, `memory://` in the first cell.
_STORES = {
    "sqlite": "`sqlite:///",
    "redis": "`redis://",
    "memory": "`memory://`",
}
_REASON = re.compile(r"`(?:UNAVAILABLE|ABORTED)` / `([A-Z_]+)`")


def stop_section() -> str:
    text = PAGE.read_text()
    start = text.index("## What a stop does\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def documented_waiter_reason(store: str) -> str:
    """The ErrorInfo reason the page promises a waiting call when ``store`` stops."""
    prefix = _STORES[store]
    rows = [line for line in stop_section().splitlines() if line.startswith(f"| {prefix}")]
    assert len(rows) == 1, f"one row for {store} in the stop table, found {len(rows)}"
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    cohort_cell, waiter_cell = cells[1], cells[2]
    found = _REASON.search(waiter_cell) or _REASON.search(cohort_cell)
    assert found is not None, f"no status/reason in the {store} row: {rows[0]}"
    return found.group(1)
