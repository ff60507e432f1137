"""``genrm-grpc health`` option handling (exit 2 for unusable options, before any call)."""

from __future__ import annotations

import pathlib

import pytest

from genrm_grpc.cli import main


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cert-file", "client.crt"], "--cert-file and --key-file go together"),
        (["--token-env", "TEST_GENRM_HEALTH_NO_TOKEN"], "no token"),
        (["--token-file", "/nonexistent/token"], "/nonexistent/token"),
        (["--ca-file", "/nonexistent/ca.crt"], "/nonexistent/ca.crt"),
    ],
)
def test_unusable_options_exit_2(
    args: list[str],
    needle: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TEST_GENRM_HEALTH_NO_TOKEN", raising=False)
    assert main(["health", "--server", "127.0.0.1:1", *args]) == 2
    assert needle in capsys.readouterr().err


def test_an_empty_token_file_exits_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["health", "--server", "127.0.0.1:1", "--token-file", str(empty)]) == 2
    assert "no token" in capsys.readouterr().err
