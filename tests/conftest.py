"""Suite-wide setup: every test runs on the default kind of store, a SQLite file.

The default ``store`` is ``sqlite:///genrm-state.sqlite3`` in the working directory; a
test must not share that file with another test (or leave it in the checkout), so each
module, and within it each test, gets its own file under a temporary directory, also
for the server processes it starts (they inherit the environment). Module-scoped
servers get the module's file (autouse fixtures come first within their scope). Tests
about ``memory://`` set it explicitly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.store_kinds"]


def _use_fresh_store(factory: pytest.TempPathFactory, patch: pytest.MonkeyPatch) -> Path:
    path = factory.mktemp("store") / "genrm-state.sqlite3"
    patch.setenv("GENRM_STORE", f"sqlite:///{path}")
    return path


@pytest.fixture(autouse=True, scope="module")
def _sqlite_store_per_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as patch:
        yield _use_fresh_store(tmp_path_factory, patch)


@pytest.fixture(autouse=True)
def _sqlite_store_per_test(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    return _use_fresh_store(tmp_path_factory, monkeypatch)
