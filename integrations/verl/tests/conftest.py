"""A live stack for the verl suite: fake judge + genrm-grpc (subprocesses), verl's own
reward loop in worker processes, and samples shaped as verl 0.9's agent loop makes them.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import verl
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict
from verl import DataProto

from genrm_grpc.demo import running_stack

ROOT = Path(__file__).resolve().parents[3]
MANAGER = ROOT / "integrations" / "verl" / "genrm_reward.py"
WORKER = Path(__file__).with_name("reward_worker.py")
GROUP_SIZE = 4
PROMPT_LEN = 16
RESPONSE_LEN = 24

# The overrides of docs/integrations.md's verl example (test_docs checks they agree), with
# the test's server address and tokenizer directory in place of the placeholders.
DOC_OVERRIDES = [
    "reward.reward_manager.source=importlib",
    "reward.reward_manager.name=GenRMRewardManager",
    "reward.reward_manager.module.path=integrations/verl/genrm_reward.py",
    "+reward.reward_kwargs.genrm_target=genrm-grpc:50051",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
    "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
]


@pytest.fixture(scope="session", autouse=True)
def _store_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The servers started here keep their state in a SQLite file under a temporary
    directory (genrm-grpc's default is the working directory)."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("store") / "genrm-state.sqlite3"
        patch.setenv("GENRM_STORE", f"sqlite:///{path}")
        yield


@pytest.fixture(scope="session")
def grpc_stack(_store_file: None) -> Iterator[tuple[str, str]]:
    with running_stack(["--num-rollouts-per-prompt", str(GROUP_SIZE)]) as stack:
        yield stack


WORDS = [
    "name",
    "a",
    "prime",
    "number",
    "what",
    "is",
    "the",
    "capital",
    "of",
    "france",
    "seven",
    "two",
    "four",
    "nine",
    "paris",
    "lyon",
    "it",
    "only",
    "even",
    "divisible",
    "by",
    "one",
    "and",
    "itself",
    "city",
    "river",
    "blue",
    "green",
    "red",
    ".",
    ",",
    "?",
    "!",
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny word-level tokenizer, built offline, saved as a Hugging Face directory
    (what ``actor_rollout_ref.model.path`` points verl's tokenizer loading at)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(str(path))
    return path


def verl_config(target: str, tokenizer_dir: Path, *extra: str) -> DictConfig:
    """verl 0.9.1's own default trainer config with the documented overrides."""
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    overrides = [
        o.replace("genrm-grpc:50051", target).replace(
            "integrations/verl/genrm_reward.py", str(MANAGER)
        )
        for o in DOC_OVERRIDES
    ]
    overrides += [f"actor_rollout_ref.model.path={tokenizer_dir}", *extra]
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))
    assert isinstance(merged, DictConfig)
    return merged


@dataclass(frozen=True)
class Sample:
    uid: str
    session_id: int
    question: str
    answer: str


def _object_array(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def to_dataproto(samples: Sequence[Sample], tokenizer: Any) -> DataProto:
    """Samples as verl 0.9's agent loop hands them to a reward-loop worker: prompt and
    response token ids (padded), the dataset row's fields, the prompt's ``uid`` and the
    sample's ``session_id``, ``global_steps``."""
    prompts, responses, masks = [], [], []
    for s in samples:
        p = tokenizer.encode(s.question)[:PROMPT_LEN]
        r = tokenizer.encode(s.answer)[:RESPONSE_LEN]
        prompts.append([0] * (PROMPT_LEN - len(p)) + p)
        responses.append(r + [0] * (RESPONSE_LEN - len(r)))
        masks.append(
            [0] * (PROMPT_LEN - len(p))
            + [1] * len(p)
            + [1] * len(r)
            + [0] * (RESPONSE_LEN - len(r))
        )
    prompt_t = torch.tensor(prompts, dtype=torch.int64)
    response_t = torch.tensor(responses, dtype=torch.int64)
    mask_t = torch.tensor(masks, dtype=torch.int64)
    batch = TensorDict(
        {
            "prompts": prompt_t,
            "responses": response_t,
            "input_ids": torch.cat([prompt_t, response_t], dim=1),
            "attention_mask": mask_t,
            "position_ids": torch.cumsum(mask_t, dim=1),
        },
        batch_size=len(samples),
    )
    n = len(samples)
    non_tensor = {
        "raw_prompt": _object_array([[{"role": "user", "content": s.question}] for s in samples]),
        "data_source": np.array(["genrm/test"] * n, dtype=object),
        "reward_model": _object_array([{"ground_truth": "", "style": "model"} for _ in samples]),
        "extra_info": _object_array([{"index": 0, "split": "train"} for _ in samples]),
        "uid": np.array([s.uid for s in samples], dtype=object),
        "session_id": np.array([s.session_id for s in samples], dtype=object),
        "global_steps": np.array([1] * n, dtype=object),
        "agent_name": np.array(["single_turn_agent"] * n, dtype=object),
        "__num_turns__": np.array([2] * n, dtype=object),
        "tool_extra_fields": _object_array([{} for _ in samples]),
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def run_workers(
    config: DictConfig, chunks: Sequence[DataProto], workdir: Path, timeout: float = 120
) -> list[Any]:
    """Each chunk in its own reward-loop worker process, all at once (as verl's
    streaming path spreads a step's samples over its workers); their outcomes in order."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "clients/python")])}
    procs = []
    try:
        for k, chunk in enumerate(chunks):
            path = workdir / f"chunk-{k}.pickle"
            path.write_bytes(pickle.dumps((config, chunk)))
            with path.open("rb") as stdin:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER)], stdin=stdin, stdout=subprocess.PIPE, env=env
                    )
                )
        outcomes = []
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0
            outcomes.append(pickle.loads(out))
        return outcomes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def judge_stats(judge_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{judge_url}/stats", timeout=10) as reply:
        stats: dict[str, Any] = json.load(reply)
    return stats


def judge_faults(judge_url: str, **changes: Any) -> None:
    request = urllib.request.Request(
        f"{judge_url}/faults",
        data=json.dumps(changes).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10):
        pass
