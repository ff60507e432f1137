"""`genrm-grpc config from-gym` and `serve --config` on a NeMo Gym genrm_compare file.

The file below has the shape of Gym's genrm_compare config (server wrapper, model
server block, agent block, metadata). The config shipped inside the nemo-gym package is
converted by the Gym suite (integrations/nemo_gym/genrm_grpc_compare/tests), which runs
where nemo-gym is installed.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest
import yaml

from genrm_grpc import gym_config
from genrm_grpc.config import ConfigError, load_settings

GYM_YAML = textwrap.dedent(
    """\
    genrm_compare_resources_server:
      resources_servers:
        genrm_compare:
          entrypoint: app.py
          genrm_model_server:
            type: responses_api_models
            name: genrm_model
          num_rollouts_per_prompt: 16
          genrm_responses_create_params:
            input: []
            max_output_tokens: 16384
            temperature: 0.6
            top_p: 0.95
          comparison_strategy: all_pairs
          num_judges_per_comparison: 2
          aggregator_method: simple_tiebreaker
          reasoning_bonus: 0.5
          top_percentile: 0.25
          default_score: 3.0
          debug_logging: false
          genrm_parse_retries: 2
          domain: rlhf
          verified: false
          description: pairwise GenRM
          value: rewards
    genrm_model:
      responses_api_models:
        genrm_model:
          entrypoint: app.py
          model: ${genrm_model_name}
          vllm_serve_kwargs:
            tensor_parallel_size: 4
    genrm_simple_agent:
      responses_api_agents:
        simple_agent:
          entrypoint: app.py
    """
)


def write(tmp_path: pathlib.Path, text: str, name: str = "gym.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_scoring_keys_and_create_params_carry_over_with_gym_defaults_explicit() -> None:
    conversion = gym_config.convert(yaml.safe_load(GYM_YAML))
    s = conversion.settings
    assert s["judge"]["max_output_tokens"] == 16384
    assert s["judge"]["temperature"] == 0.6 and s["judge"]["top_p"] == 0.95
    assert s["num_rollouts_per_prompt"] == 16
    assert s["comparison_strategy"] == "all_pairs" and s["num_judges_per_comparison"] == 2
    assert s["reasoning_bonus"] == 0.5 and s["top_percentile"] == 0.25
    assert s["genrm_parse_retries"] == 2
    # Gym's defaults where ours differ are written, so behaviour does not change.
    assert s["use_principle"] is False and s["cohort_evaluation_timeout_s"] == 1800.0
    for dropped in ("entrypoint", "domain", "verified", "description", "value", "debug_logging"):
        assert dropped not in s
    assert any("Gym metadata dropped" in n and "domain" in n for n in conversion.notes)
    assert any("genrm_simple_agent" in n for n in conversion.notes)


def test_model_server_without_base_url_gives_marked_placeholders() -> None:
    conversion = gym_config.convert(yaml.safe_load(GYM_YAML))
    judge = conversion.settings["judge"]
    assert judge["url"] == gym_config.PLACEHOLDER_URL
    assert judge["model"] == gym_config.PLACEHOLDER_MODEL
    assert conversion.placeholders == ["judge.url", "judge.model"]
    text = gym_config.render(conversion, "gym.yaml")
    assert f"url: {gym_config.PLACEHOLDER_URL}  # PLACEHOLDER" in text
    assert "# PLACEHOLDER: judge.url — replace it here or set GENRM_JUDGE__URL." in text
    assert any("genrm_model_name" in n for n in conversion.notes)


def test_model_server_block_gives_judge_url_model_and_key_env() -> None:
    data = yaml.safe_load(GYM_YAML)
    data["genrm_model"]["responses_api_models"]["genrm_model"] = {
        "entrypoint": "app.py",
        "base_url": "http://vllm-genrm:8000/v1",
        "api_key": "${oc.env:GENRM_KEY}",
        "model": "${genrm_model_name}",
    }
    data["genrm_model_name"] = "nvidia/Qwen3-Nemotron-235B-A22B-GenRM"
    judge = gym_config.convert(data).settings["judge"]
    assert judge == {
        "url": "http://vllm-genrm:8000/v1",
        "api": "chat_completions",
        "model": "nvidia/Qwen3-Nemotron-235B-A22B-GenRM",
        "max_output_tokens": 16384,
        "temperature": 0.6,
        "top_p": 0.95,
        "api_key_env": "GENRM_KEY",
    }


def test_literal_api_key_is_never_copied() -> None:
    data = yaml.safe_load(GYM_YAML)
    data["genrm_model"]["responses_api_models"]["genrm_model"]["api_key"] = "sk-secret"
    conversion = gym_config.convert(data)
    assert "sk-secret" not in gym_config.render(conversion, "gym.yaml")
    assert any("api_key is not copied" in n for n in conversion.notes)


def test_unset_gym_defaults_are_written_explicitly() -> None:
    data = yaml.safe_load(GYM_YAML)
    del data["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"][
        "num_rollouts_per_prompt"
    ]
    s = gym_config.convert(data).settings
    assert s["num_rollouts_per_prompt"] == 1  # Gym's default, not our 8


def test_use_principle_without_its_text_is_refused_where_gym_is_absent() -> None:
    data = yaml.safe_load(GYM_YAML)
    data["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"][
        "use_principle"
    ] = True
    with pytest.raises(gym_config.GymConfigError, match="set default_principle"):
        gym_config.convert(data)
    block = data["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    block["default_principle"] = "Prefer correct answers."
    s = gym_config.convert(data).settings
    assert s["use_principle"] is True and s["default_principle"] == "Prefer correct answers."


def test_several_genrm_blocks_need_a_choice() -> None:
    data = yaml.safe_load(GYM_YAML)
    data["second"] = {"resources_servers": {"genrm_compare": {"num_rollouts_per_prompt": 4}}}
    with pytest.raises(gym_config.GymConfigError, match="--block NAME"):
        gym_config.convert(data)
    assert gym_config.convert(data, block_name="second").settings["num_rollouts_per_prompt"] == 4


def test_serve_config_loads_a_gym_file_as_converted(tmp_path: pathlib.Path) -> None:
    settings = load_settings(write(tmp_path, GYM_YAML), judge_schedule="eager")
    assert settings.num_rollouts_per_prompt == 16
    assert settings.comparison_strategy == "all_pairs"
    assert settings.use_principle is False
    assert settings.cohort_evaluation_timeout_s == 1800.0
    assert settings.judge.max_output_tokens == 16384
    assert settings.judge.url == gym_config.PLACEHOLDER_URL
    assert settings.judge_schedule == "eager"  # flags still override


def test_gym_file_with_a_bad_value_is_one_config_error(tmp_path: pathlib.Path) -> None:
    bad = GYM_YAML.replace("top_percentile: 0.25", "top_percentile: 7")
    with pytest.raises(ConfigError, match="top_percentile"):
        load_settings(write(tmp_path, bad))


def test_config_from_gym_prints_yaml_that_serve_accepts(tmp_path: pathlib.Path) -> None:
    src = write(tmp_path, GYM_YAML)
    out = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "config", "from-gym", str(src)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    converted = write(tmp_path, out.stdout, "converted.yaml")
    settings = load_settings(converted)
    assert settings == load_settings(src)
    assert out.stdout.startswith("# genrm-grpc configuration converted from the NeMo Gym config")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("listen: 127.0.0.1:1\n", "not a NeMo Gym config"),
        ("a: [1\n", "not valid YAML"),
        ("x:\n  resources_servers:\n    other: {}\n", "no genrm_compare resources server block"),
    ],
)
def test_config_from_gym_refuses_with_one_line_and_exit_2(
    tmp_path: pathlib.Path, text: str, needle: str
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "genrm_grpc.cli", "config", "from-gym", str(write(tmp_path, text))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert needle in out.stderr and out.stderr.count("\n") == 1
