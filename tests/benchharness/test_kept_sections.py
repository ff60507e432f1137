"""Regenerating docs/performance.md keeps the sections written by hand or elsewhere."""

from __future__ import annotations

from bench.mpreport import KEPT_SECTIONS, keep_sections, kept_placeholder

GENERATED = (
    "# Performance\n\nnew figures\n\n" + kept_placeholder("judge-client") + "\n\n## Reproduce\n"
)
OLD = (
    "# Performance\n\nold figures\n\n"
    "<!-- BEGIN KEPT SECTION: judge-client -->\n"
    "## Judge client\n\naiohttp 1.9× httpx (hand-written)\n"
    "<!-- END KEPT SECTION: judge-client -->\n\n## Reproduce\n"
)


def test_a_kept_section_of_the_old_page_replaces_the_placeholder() -> None:
    page = keep_sections(GENERATED, OLD)
    assert "new figures" in page and "old figures" not in page
    assert "## Judge client\n\naiohttp 1.9× httpx (hand-written)\n" in page
    assert page.index("aiohttp 1.9×") < page.index("## Reproduce")
    assert page.count("BEGIN KEPT SECTION: judge-client") == 1


def test_regenerating_twice_keeps_the_section_once() -> None:
    once = keep_sections(GENERATED, OLD)
    assert keep_sections(GENERATED, once) == once


def test_without_an_old_page_the_empty_placeholder_stays() -> None:
    assert keep_sections(GENERATED, None) == GENERATED
    assert "judge-client" in KEPT_SECTIONS


def test_a_kept_section_without_a_placeholder_is_appended_not_lost() -> None:
    old = OLD.replace("judge-client", "notes")
    page = keep_sections(GENERATED, old)
    assert page.rstrip().endswith("<!-- END KEPT SECTION: notes -->")
    assert "aiohttp 1.9× httpx (hand-written)" in page
