"""docs/architecture.md names, for each protocol rule, the function that decides it:
every function it names must exist where it says (a rename has to update the page)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import genrm_grpc

PAGE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
_TOKEN = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"^genrm_grpc/[\w/]+\.py$")
_NAME = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")


def _rule_rows() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Where each rule is decided", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]


def _modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(genrm_grpc.__path__, "genrm_grpc.")]
    return [importlib.import_module(n) for n in names if ".testing" not in n]


def _resolves(module: ModuleType, dotted: str) -> bool:
    target: object = module
    for part in dotted.split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    return callable(target)


def test_every_function_the_rule_table_names_exists() -> None:
    rows = _rule_rows()
    assert len(rows) >= 10, "the rule table was not found"
    modules = _modules()
    missing = []
    named = 0
    for row in rows:
        for cell in row[1:]:
            module: ModuleType | None = None
            for token in _TOKEN.findall(cell):
                if _PATH.match(token):
                    module = importlib.import_module(token[:-3].replace("/", "."))
                    continue
                if not _NAME.match(token):
                    continue
                named += 1
                where = [module] if module is not None else modules
                if not any(_resolves(m, token) for m in where):
                    missing.append(f"{token} (row {row[0]!r})")
    assert named >= 20
    assert missing == []


def test_the_check_refuses_a_name_that_does_not_exist() -> None:
    registry = importlib.import_module("genrm_grpc.cohort.registry")
    assert _resolves(registry, "CohortRegistry._new_cohort_refusal")
    assert not _resolves(registry, "CohortRegistry.no_such_rule")
