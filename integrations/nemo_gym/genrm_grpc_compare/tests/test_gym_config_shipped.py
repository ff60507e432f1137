"""Migration of the genrm_compare config shipped inside the nemo-gym package."""

from __future__ import annotations

import importlib.util
import pathlib
import signal
import subprocess
import sys

import pytest
import yaml
from nemo_gym.config_types import ConfigMissingValuesError
from nemo_gym.global_config import GlobalConfigDictParser
from omegaconf import DictConfig, OmegaConf
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


def _parse_with_gym(**overrides: object) -> DictConfig:
    """This server's config as Gym's own parser composes it from one config_paths entry."""
    # The policy models a training config brings (as in genrm_compare.yaml's agents).
    policy = {"responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}}
    initial = {
        "config_paths": [str(HERE / "configs/genrm_grpc_compare.yaml")],
        "policy_model": policy,
        "policy_model_reasoning_off": policy,
        **overrides,
    }
    return GlobalConfigDictParser().parse_no_environment(OmegaConf.create(initial))


def test_the_shipped_config_names_the_values_a_gym_user_must_set_when_they_are_unset() -> None:
    with pytest.raises(ConfigMissingValuesError) as caught:
        _parse_with_gym()
    message = str(caught.value)
    assert "++genrm_grpc_target=<value>" in message
    assert "++genrm_grpc_num_rollouts_per_prompt=<value>" in message


def test_one_config_paths_entry_and_two_values_give_a_valid_server_and_genrm_compares_agents() -> (
    None
):
    parsed = _parse_with_gym(
        genrm_grpc_target="genrm-grpc.example:50051", genrm_grpc_num_rollouts_per_prompt=8
    )
    block = OmegaConf.to_container(
        parsed["genrm_grpc_compare_resources_server"]["resources_servers"]["genrm_grpc_compare"],
        resolve=True,
    )
    assert isinstance(block, dict)
    config = GenRMGrpcCompareConfig.model_validate(
        block | {"name": "genrm_grpc_compare_resources_server", "host": "127.0.0.1", "port": 0}
    )
    assert config.grpc_target == "genrm-grpc.example:50051"
    assert config.num_rollouts_per_prompt == 8
    # The agents keep genrm_compare's names: rollout data needs no change.
    gym_agents = {
        name
        for name, value in yaml.safe_load(shipped_config().read_text()).items()
        if isinstance(value, dict) and "responses_api_agents" in value
    }
    assert gym_agents == {"genrm_simple_agent", "genrm_simple_agent_reasoning_off"}
    for name in gym_agents:
        agent = parsed[name]["responses_api_agents"]["simple_agent"]
        assert agent["resources_server"]["name"] == "genrm_grpc_compare_resources_server"
