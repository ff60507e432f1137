"""No production or client module draws from the ``random`` module's shared generator.

Retry and sweep jitter come from a ``random.Random()`` of each module's own: a trainer or
collector that seeds ``random`` for a reproducible run gets the same numbers whether or
not a call was retried, and a test that generates data with hypothesis while a server
runs in another thread sees no draw it did not make.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = (ROOT / "genrm_grpc", ROOT / "clients" / "python" / "genrm_cohort_client")
#: What may be taken from the module: generators of one's own.
OWN_GENERATORS = {"Random", "SystemRandom"}


def shared_draws(name: str, source: str) -> list[str]:
    """Every use of the shared generator in ``source``: ``random.uniform``, an alias's
    ``_random.random``, ``from random import choice``."""
    tree = ast.parse(source)
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "random"
    }
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            taken = [a.name for a in node.names if a.name not in OWN_GENERATORS]
            found += [(node.lineno, f"from random import {n}") for n in taken]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr not in OWN_GENERATORS
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return [f"{name}:{line} {what}" for line, what in sorted(found)]


def test_no_module_draws_from_the_shared_random_generator() -> None:
    found = []
    for folder in CHECKED:
        for path in sorted(folder.rglob("*.py")):
            name = str(path.relative_to(ROOT))
            found += shared_draws(name, path.read_text(encoding="utf-8"))
    assert found == []


def test_the_check_finds_each_way_of_reaching_the_shared_generator() -> None:
    source = (
        "import random\nimport random as _r\nfrom random import choice, Random\n"
        "x = random.uniform(0, 1)\ny = _r.random\nz = random.Random()\n"
    )
    assert shared_draws("m.py", source) == [
        "m.py:3 from random import choice",
        "m.py:4 random.uniform",
        "m.py:5 _r.random",
    ]
