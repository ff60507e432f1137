"""A live stack for the OpenRLHF tests: fake judge + genrm-grpc serve (subprocesses).

OpenRLHF's own reward path runs in the test process: ``SingleTurnAgentExecutor`` from
the installed openrlhf package loads integrations/openrlhf/genrm_reward.py as
``--reward.remote_url`` does, and its ``execute`` is gathered n times per prompt as
``RolloutRayActor.generate_responses`` does. Only the vLLM engine is replaced (by an
``async generate`` that returns fixed answers) and the tokenizer is built offline.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from genrm_grpc.demo import running_stack

ROOT = pathlib.Path(__file__).resolve().parents[3]
REWARD_FILE = ROOT / "integrations/openrlhf/genrm_reward.py"
GROUP_SIZE = 4


class Judge:
    def __init__(self, url: str) -> None:
        self.url = url

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as reply:
            stats: dict[str, Any] = json.load(reply)
        return stats

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/stats/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def faults(self, **changes: Any) -> None:
        request = urllib.request.Request(
            f"{self.url}/faults",
            data=json.dumps(changes).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Judge, str]]:
    store = tmp_path_factory.mktemp("store") / "genrm-state.sqlite3"
    with running_stack(
        ["--num-rollouts-per-prompt", str(GROUP_SIZE)], store=f"sqlite:///{store}"
    ) as (judge_url, target):
        yield Judge(judge_url), target


@pytest.fixture
def judge(live: tuple[Judge, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Judge]:
    judge, target = live
    monkeypatch.setenv("GENRM_GRPC_TARGET", target)
    monkeypatch.setenv("GENRM_OPENRLHF_GROUP_SIZE", str(GROUP_SIZE))
    monkeypatch.setenv("GENRM_OPENRLHF_SIBLING_TIMEOUT_S", "30")  # a bug fails, not hangs
    judge.faults(fail_503_rate=0.0, retry_after_s=None)
    judge.reset()
    yield judge
    judge.faults(fail_503_rate=0.0, retry_after_s=None)


def offline_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no merges: decode(encode(text)) == text, no download."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core)


class FakeEngine:
    """vLLM's place: the k-th generation of a prompt returns its k-th answer, and no
    generation of a prompt returns before all n of that prompt have started, so the n
    reward calls of a prompt are in flight together, as under vLLM."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, answers: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.answers = answers
        self.started: dict[str, int] = defaultdict(int)
        self.all_started: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.release_order: dict[str, list[int]] = {}

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, **_: Any) -> Any:
        prompt = self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        k = self.started[prompt]
        self.started[prompt] += 1
        if self.started[prompt] == len(self.answers[prompt]):
            self.all_started[prompt].set()
        await self.all_started[prompt].wait()
        answer = self.answers[prompt][k]
        ids = self.tokenizer(text=answer, add_special_tokens=False)["input_ids"]
        output = SimpleNamespace(token_ids=ids, text=answer, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[output])


async def generate_responses(
    executor: Any, engine: FakeEngine, prompt: str, label: str | None = None
) -> list[dict[str, Any]]:
    """``RolloutRayActor.generate_responses`` (openrlhf/trainer/ray/vllm_engine.py): the n
    samples of one prompt, ``executor.execute`` gathered n times."""
    n = len(engine.answers[prompt])
    params = SimpleNamespace(max_tokens=64, logprobs=None)
    return await asyncio.gather(
        *(
            executor.execute(
                prompt=prompt,
                label=label,
                sampling_params=params,
                max_length=1024,
                hf_tokenizer=engine.tokenizer,
                llm_engine=engine,
            )
            for _ in range(n)
        )
    )
