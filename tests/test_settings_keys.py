"""Every configuration key is declared once in ``Settings``, read, and documented.

Components read scoped views of the one ``Settings`` (read-only Protocols), so a key
that no view declares and no code reads would configure nothing; a key missing from
README's configuration table would be undocumented. Both are caught here, generically.
"""

from __future__ import annotations

import pathlib
import re

from genrm_grpc.cohort.registry import RegistryView
from genrm_grpc.config import Settings, config_keys
from genrm_grpc.judge.client import JudgeView
from genrm_grpc.runtime.live import RuntimeView
from genrm_grpc.server.bounds import BoundsView
from genrm_grpc.store.memory import StoreView

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _source() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "genrm_grpc").rglob("*.py")))


def _readme_table_keys() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


def _read_somewhere(key: str, source: str) -> bool:
    leaf = key.rsplit(".", 1)[-1]
    patterns = [rf"settings\.{re.escape(key)}\b", rf"def {leaf}\(self\)"]
    if "." in key:
        block = key.split(".", 1)[0]
        patterns.append(rf"\b(self|cfg|config|{block})\.{leaf}\b")
    return any(re.search(pattern, source) for pattern in patterns)


def test_every_settings_key_is_read_by_a_view_or_the_server() -> None:
    source = _source()
    unread = [key for key in config_keys() if not _read_somewhere(key, source)]
    assert unread == [], f"settings keys that nothing reads: {unread}"


def test_every_settings_key_has_a_row_in_the_readme_configuration_table() -> None:
    documented = _readme_table_keys()
    missing = [
        key
        for key in config_keys()
        if key not in documented and not any(d.startswith(key + ".") for d in documented)
    ]
    assert missing == [], f"settings keys missing from README's configuration table: {missing}"


def test_settings_satisfies_every_component_view_with_its_own_values() -> None:
    settings = Settings(
        cohort_collection_timeout_s=12.0,
        max_terminal_cohorts=7,
        judge_schedule="eager",
        genrm_parse_retries=5,
        max_text_chars=99,
    )
    registry: RegistryView = settings
    store: StoreView = settings
    runtime: RuntimeView = settings
    judge: JudgeView = settings
    bounds: BoundsView = settings
    assert registry.cohort_collection_timeout_s == 12.0
    assert store.max_terminal_cohorts == 7
    assert runtime.judge_schedule == "eager" and runtime.top_percentile == 0.2
    assert judge.genrm_parse_retries == 5 and judge.judge.url == "http://127.0.0.1:8000"
    assert bounds.max_text_chars == 99
    assert bounds.pass_plan().pass_count(8) == 8
