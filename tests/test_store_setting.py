"""The ``store`` setting: a file by default, memory on request, Redis refused for now."""

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
        ("redis://127.0.0.1:6379/0", "not available yet"),
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
