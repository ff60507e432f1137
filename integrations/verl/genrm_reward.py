"""verl batch reward function backed by genrm-grpc (see docs/integrations.md).

Use it with verl's batch reward manager::

    reward_model.reward_manager=batch
    custom_reward_function.path=integrations/verl/genrm_reward.py
    custom_reward_function.name=compute_score
    +custom_reward_function.reward_kwargs.target=genrm-grpc:50051

verl passes no prompt to ``compute_score``: put the prompt text in each row's
``extra_info["question"]`` when you prepare the dataset (verl's own example datasets
do). Samples of one prompt form one group: by ``extra_info["index"]`` when present,
else by prompt text.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from genrm_cohort_client import SyncCohortClient, score_samples

_clients: dict[str, SyncCohortClient] = {}
_lock = threading.Lock()


def _client(target: str) -> SyncCohortClient:
    # One channel per target for the whole run: the reward function is called every step.
    with _lock:
        if target not in _clients:
            _clients[target] = SyncCohortClient(target)
        return _clients[target]


def compute_score(
    data_sources: list[str],
    solution_strs: list[str],
    ground_truths: list[Any],
    extra_infos: list[dict[str, Any] | None],
    target: str | None = None,
    timeout_s: float = 3600.0,
    **kwargs: Any,
) -> list[dict[str, float]]:
    """One score dict per sample, in batch order; ``score`` is the reward verl trains on.

    A masked sample (the judge failed for its group) gets the mean reward of the unmasked
    members of its group, so its group-relative advantage is zero, and is reported as
    ``genrm_masked = 1.0`` in verl's reward_extra_info — never a silent 0.0.
    """
    infos = [info or {} for info in extra_infos]
    prompts = [str(info.get("question") or info.get("prompt") or "") for info in infos]
    if not all(prompts):
        raise ValueError("genrm reward: every row needs extra_info['question'] (the prompt)")
    keys = [(info.get("index"), prompt) for info, prompt in zip(infos, prompts, strict=True)]
    scores = score_samples(
        _client(target or os.environ.get("GENRM_GRPC_TARGET", "127.0.0.1:50051")),
        prompts,
        solution_strs,
        group_keys=keys,
        timeout=timeout_s,
    )
    rewards = scores.rewards_with_masked_as_group_mean()
    return [
        {"score": reward, "genrm_masked": float(masked)}
        for reward, masked in zip(rewards, scores.mask, strict=True)
    ]
