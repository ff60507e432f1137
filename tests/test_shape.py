"""The shape the code keeps: no production module over 500 lines and no function over
60, unless the module's docstring says why that one is better whole (``stays one
module`` for the module, ``stays whole`` next to the function's name for a function)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "genrm_grpc"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def shape_faults(name: str, source: str) -> list[str]:
    """What in ``source`` breaks the rule above, without the reason the rule asks for."""
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    faults = []
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES and "stays one module" not in doc:
        faults.append(f"{name}: {lines} lines, and its docstring does not say why")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            named = f"``{node.name}``" in doc and "stays whole" in doc
            if length > MAX_FUNCTION_LINES and not named:
                faults.append(f"{name}: {node.name} is {length} lines, and nothing says why")
    return faults


def test_no_production_module_or_function_outgrows_its_bound_without_a_reason() -> None:
    faults = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE.parent))
        faults.extend(shape_faults(name, path.read_text(encoding="utf-8")))
    assert faults == []


def test_the_shape_check_refuses_a_long_module_or_function_without_a_reason() -> None:
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert shape_faults("m.py", long_function) == ["m.py: f is 61 lines, and nothing says why"]
    reasoned = '"""``f`` is long and stays whole: a flat table."""\n' + long_function
    assert shape_faults("m.py", reasoned) == []
    long_module = '"""A module."""\n' + "x = 1\n" * MAX_MODULE_LINES
    faults = shape_faults("m.py", long_module)
    assert faults == ["m.py: 501 lines, and its docstring does not say why"]
    kept = '"""It stays one module on purpose."""\n' + "x = 1\n" * MAX_MODULE_LINES
    assert shape_faults("m.py", kept) == []
