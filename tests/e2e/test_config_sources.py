"""Configuration sources: flags > GENRM_* env > YAML > defaults, every mistake an error."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from genrm_grpc.config import ConfigError, config_keys, env_name, load_settings

SERVE = [sys.executable, "-m", "genrm_grpc.cli", "serve"]


def _serve_refused(args: list[str], env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("GENRM_")}
    done = subprocess.run(
        [*SERVE, *args], capture_output=True, text=True, timeout=60, env={**clean, **env}
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.e2e
def test_serve_refuses_a_misspelt_env_variable_with_a_did_you_mean() -> None:
    line = _serve_refused(["--listen", "127.0.0.1:0"], {"GENRM_JUDGE_URL": "http://judge:8000"})
    assert line == (
        "genrm-grpc: invalid configuration: unknown environment variable GENRM_JUDGE_URL "
        "(did you mean GENRM_JUDGE__URL?)"
    )


@pytest.mark.e2e
def test_serve_refuses_an_unknown_yaml_key_with_a_did_you_mean(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("listen: 127.0.0.1:0\njudge:\n  ulr: http://judge:8000\n")
    line = _serve_refused(["--config", str(config)], {})
    assert line == (
        "genrm-grpc: invalid configuration: judge.ulr: Extra inputs are not permitted "
        "(did you mean judge.url?)"
    )


def test_unknown_genrm_variables_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENRM_LISTN", "0.0.0.0:1")
    with pytest.raises(ConfigError, match=r"GENRM_LISTN \(did you mean GENRM_LISTEN\?\)"):
        load_settings()
    monkeypatch.delenv("GENRM_LISTN")
    monkeypatch.setenv("GENRM_SECRET_SAUCE", "x")
    with pytest.raises(ConfigError, match=r"named by judge\.api_key_env or auth\.tokens_env"):
        load_settings()


def test_variables_named_by_the_configuration_are_not_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GENRM_JUDGE_API_KEY", "sk-test")
    monkeypatch.setenv("GENRM_TOKENS", "tok-1,tok-2")
    settings = load_settings(
        judge={"api_key_env": "GENRM_JUDGE_API_KEY"}, auth={"tokens_env": "GENRM_TOKENS"}
    )
    assert settings.judge.api_key() == "sk-test"
    assert settings.auth is not None and settings.auth.tokens() == ("tok-1", "tok-2")


def test_every_key_has_an_env_variable_that_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_name("judge.url") == "GENRM_JUDGE__URL"
    assert "tls.cert_file" in config_keys() and "listen_reuse_port" in config_keys()
    monkeypatch.setenv("GENRM_JUDGE__MODEL", "from-env")
    monkeypatch.setenv("genrm_log_format", "text")  # names are case-insensitive
    settings = load_settings()
    assert settings.judge.model == "from-env" and settings.log_format == "text"


def test_precedence_is_flags_then_env_then_yaml_then_defaults_key_by_key(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        "listen: 127.0.0.1:1111\nnum_rollouts_per_prompt: 4\nshutdown_grace_s: 7\n"
        "judge: {url: http://yaml:1, model: yaml-model, api: chat_completions}\n"
    )
    monkeypatch.setenv("GENRM_NUM_ROLLOUTS_PER_PROMPT", "6")
    monkeypatch.setenv("GENRM_LISTEN", "127.0.0.1:2222")
    monkeypatch.setenv("GENRM_JUDGE__MODEL", "env-model")
    settings = load_settings(config, listen="127.0.0.1:3333", judge={"url": "http://flag:1"})
    assert settings.listen == "127.0.0.1:3333"  # flag over env over YAML
    assert settings.num_rollouts_per_prompt == 6  # env over YAML
    assert settings.shutdown_grace_s == 7  # YAML over default
    assert settings.judge_max_concurrency == 64  # default
    # One judge flag overrides one key; the block's other keys still come from env/YAML.
    assert settings.judge.url == "http://flag:1"
    assert settings.judge.model == "env-model"
    assert settings.judge.api == "chat_completions"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read config file {path}: No such file or directory"),
        ("- a\n- b\n", "config file {path} must hold a mapping at the top level"),
        ("7\n", "config file {path} must hold a mapping at the top level"),
        ("listen: [\n", "config file {path} is not valid YAML: "),
    ],
)
def test_yaml_file_problems_are_one_line_errors(
    tmp_path: pathlib.Path, text: str | None, message: str
) -> None:
    path = tmp_path / "server.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value).startswith(message.format(path=path))
    assert "\n" not in str(caught.value)


def test_an_empty_yaml_file_means_the_defaults(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("")
    assert load_settings(path).listen == "127.0.0.1:50051"
