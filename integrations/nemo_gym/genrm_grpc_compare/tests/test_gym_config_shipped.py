"""Migration of the genrm_compare config shipped inside the nemo-gym package."""

from __future__ import annotations

import importlib.util
import pathlib
import signal
import subprocess
import sys

import pytest
import yaml
from resources_servers.genrm_compare.app import GenRMCompareConfig

from genrm_grpc import gym_config
from genrm_grpc.config import load_settings
from genrm_grpc_compare.app import GenRMGrpcCompareConfig

HERE = pathlib.Path(__file__).resolve().parent.parent


def shipped_config() -> pathlib.Path:
    spec = importlib.util.find_spec("resources_servers.genrm_compare")
    assert spec is not None and spec.submodule_search_locations
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "configs/genrm_compare.yaml"
    assert path.is_file(), path
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_config_from_gym_converts_the_shipped_genrm_compare_config(
    tmp_path: pathlib.Path,
) -> None:
    out = tmp_path / "server.yaml"
    done = cli("config", "from-gym", str(shipped_config()), "--output", str(out))
    assert done.returncode == 0, done.stderr
    shipped = yaml.safe_load(shipped_config().read_text())
    block = shipped["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    settings = load_settings(out)
    assert settings.num_rollouts_per_prompt == block["num_rollouts_per_prompt"]
    params = block["genrm_responses_create_params"]
    assert settings.judge.max_output_tokens == params["max_output_tokens"]
    assert settings.judge.temperature == params["temperature"]
    assert settings.judge.top_p == params["top_p"]
    assert settings.comparison_strategy == block["comparison_strategy"]
    assert settings.use_principle is block["use_principle"] is False
    # Gym's own default, read from Gym's config class, is written explicitly.
    gym_default = GenRMCompareConfig.model_fields
    if "cohort_evaluation_timeout_s" in gym_default:
        assert (
            settings.cohort_evaluation_timeout_s
            == gym_default["cohort_evaluation_timeout_s"].default
        )
    assert settings.cohort_evaluation_timeout_s == 1800.0
    text = out.read_text()
    assert "url: http://genrm-judge.placeholder.invalid:8000  # PLACEHOLDER" in text
    assert "Gym metadata dropped" in text


@pytest.mark.parametrize("which", ["converted", "shipped"])
def test_serve_starts_on_the_converted_and_on_the_shipped_gym_file(
    tmp_path: pathlib.Path, which: str
) -> None:
    config = shipped_config()
    if which == "converted":
        config = tmp_path / "server.yaml"
        assert cli("config", "from-gym", str(shipped_config()), "-o", str(config)).returncode == 0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genrm_grpc.cli",
            "serve",
            "--config",
            str(config),
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("genrm-grpc serving on 127.0.0.1:"), line
        target = line.split()[-1]
        health = cli("health", "--server", target)
        assert health.returncode == 0 and "SERVING" in health.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    if which == "shipped":
        assert "is a NeMo Gym config: judge.url is a placeholder" in err


def test_use_principle_takes_gyms_default_principle_from_nemo_gym() -> None:
    data = yaml.safe_load(shipped_config().read_text())
    data["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"][
        "use_principle"
    ] = True
    settings = gym_config.convert(data).settings
    assert settings["use_principle"] is True
    assert (
        settings["default_principle"]
        == GenRMCompareConfig.model_fields["default_principle"].default
    )


def test_this_servers_example_config_validates_as_its_gym_config() -> None:
    data = yaml.safe_load((HERE / "configs/genrm_grpc_compare.yaml").read_text())
    block = data["genrm_grpc_compare_resources_server"]["resources_servers"]["genrm_grpc_compare"]
    config = GenRMGrpcCompareConfig.model_validate(
        block | {"name": "genrm_grpc_compare_resources_server", "host": "127.0.0.1", "port": 0}
    )
    assert config.grpc_target == "127.0.0.1:50051" and config.num_rollouts_per_prompt == 16
