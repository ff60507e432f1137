"""docs/integrations.md's OpenRLHF section is what the installed 0.11.2 accepts and what
the suite runs."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import openrlhf

from .conftest import REWARD_FILE, ROOT

SECTION = (ROOT / "docs/integrations.md").read_text().split("### OpenRLHF", 1)[1]
COMMAND = re.search(r"```sh\n(.*?)```", SECTION, re.S).group(1)  # type: ignore[union-attr]


def train_ppo_ray_flags() -> set[str]:
    """Every option train_ppo_ray's parser defines, read from the installed source (the
    module itself imports ray, deepspeed and vLLM)."""
    source = Path(openrlhf.__file__).parent / "cli/train_ppo_ray.py"
    flags = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    flags.add(arg.value)
    return flags


def test_the_documented_flags_exist_in_openrlhf_0_11_2_and_the_stale_ones_do_not() -> None:
    known = train_ppo_ray_flags()
    words = shlex.split(COMMAND.replace("\\\n", " "))
    used = [w for w in words if w.startswith("--")]
    assert {"--reward.remote_url", "--rollout.n_samples_per_prompt"} <= set(used)
    assert set(used) <= known, set(used) - known
    assert "--remote_rm_url" not in known and "--n_samples_per_prompt" not in known
    assert "--remote_rm_url" not in COMMAND and "--n_samples_per_prompt " not in COMMAND


def test_the_documented_reward_file_and_settings_are_the_tested_ones() -> None:
    words = shlex.split(COMMAND.replace("\\\n", " "))
    path = words[words.index("--reward.remote_url") + 1]
    assert ROOT / path == REWARD_FILE
    n = words[words.index("--rollout.n_samples_per_prompt") + 1]
    assert f"GENRM_OPENRLHF_GROUP_SIZE={n}" in COMMAND
    code = REWARD_FILE.read_text()
    documented = set(re.findall(r"GENRM_[A-Z_]+", SECTION))
    read = set(re.findall(r'"(GENRM_[A-Z_]+)"', code))
    assert documented == read, (documented - read, read - documented)
