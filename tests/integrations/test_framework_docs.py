"""docs/integrations.md gives the verl overrides the verl suite runs with.

The verl suite (integrations/verl/tests, under the installed verl) composes verl's config
from ``DOC_OVERRIDES``; this check runs in the main suite, without verl, so that the page
and the tested overrides cannot drift apart.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _doc_overrides() -> list[str]:
    tree = ast.parse((ROOT / "integrations/verl/tests/conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DOC_OVERRIDES" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(v) for v in value]
    raise AssertionError("integrations/verl/tests/conftest.py defines no DOC_OVERRIDES")


def test_the_verl_command_in_the_docs_is_the_one_the_verl_suite_runs() -> None:
    doc = (ROOT / "docs/integrations.md").read_text()
    section = doc[doc.index("### verl\n") : doc.index("### OpenRLHF\n")]
    command = section[section.index("```sh") : section.index("```", section.index("```sh") + 5)]
    lines = {line.strip().rstrip("\\").strip() for line in command.splitlines()}
    missing = [o for o in _doc_overrides() if o not in lines]
    assert not missing, f"docs/integrations.md's verl command lacks {missing}"


def test_the_managers_docstring_loads_it_with_the_documented_keys() -> None:
    module = ast.parse((ROOT / "integrations/verl/genrm_reward.py").read_text())
    docstring = ast.get_docstring(module) or ""
    manager_keys = [o for o in _doc_overrides() if "reward_manager" in o or "reward_kwargs" in o]
    assert manager_keys
    assert all(k in docstring for k in manager_keys), manager_keys
