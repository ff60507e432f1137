"""The layers import downwards only: the decision core (``genrm_grpc/cohort/``, with the
scoring it aggregates with) imports nothing from the stores, the runtime or the server;
the stores depend on the core's record types, never the reverse."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "genrm_grpc"

#: What each layer may import from the package, besides itself.
ALLOWED = {
    "cohort": ("genrm_grpc.cohort", "genrm_grpc.scoring"),
    "scoring": ("genrm_grpc.scoring",),
}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name == "genrm_grpc" or name.startswith("genrm_grpc.")]


def test_the_decision_core_imports_nothing_from_stores_runtime_or_server() -> None:
    crossing = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for name in _imports(path):
                if not name.startswith(allowed):
                    crossing.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert crossing == []


def test_the_layer_check_sees_the_core_modules() -> None:
    # Guards the check above against a moved folder, which would make it pass vacuously.
    registry = PACKAGE / "cohort" / "registry.py"
    assert "genrm_grpc.cohort.records" in _imports(registry)
