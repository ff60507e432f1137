"""The ``store`` setting: a file by default, memory on request, Redis for replicas."""

from __future__ import annotations

import pytest

from genrm_grpc.config import ConfigError, Settings, load_settings


def test_the_default_store_is_a_sqlite_file_in_the_working_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GENRM_STORE")
    assert Settings().store == "sqlite:///genrm-state.sqlite3"


def test_memory_is_accepted_under_its_old_name_and_as_a_url() -> None:
    assert load_settings(store="memory").store == "memory://"
    assert load_settings(store="memory://").store == "memory://"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis://127.0.0.1:6379/zero", "must be a number"),
        ("sqlite://host/file", "has no host"),
        ("sqlite:///", "names no file"),
        ("postgres://db/genrm", "the scheme must be"),
    ],
)
def test_a_store_the_server_cannot_serve_from_is_a_configuration_error(
    url: str, words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(store=url)
    assert words in str(refused.value)


def test_a_redis_store_is_accepted_with_either_judge_schedule() -> None:
    assert load_settings(store="redis://127.0.0.1:6379/0").store == "redis://127.0.0.1:6379/0"
    assert load_settings(store="redis://127.0.0.1:6379/0").replica_lease_s == 10.0
    eager = load_settings(store="redis://127.0.0.1:6379/0", judge_schedule="eager")
    assert eager.judge_schedule == "eager"


def test_a_server_on_a_file_never_imports_the_redis_client() -> None:
    """The NeMo Gym venv (and any deployment on a file) has no redis-py: the server and
    its stores must import without it."""
    import subprocess
    import sys

    probe = (
        "import sys, genrm_grpc.server.app, genrm_grpc.store.durable as d; "
        "d.store_from_url('sqlite:///x.sqlite3'); d.store_from_url('memory://'); "
        "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
