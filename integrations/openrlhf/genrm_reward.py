"""OpenRLHF custom reward function backed by genrm-grpc (see docs/integrations.md).

Use it as OpenRLHF's reward function file::

    --remote_rm_url integrations/openrlhf/genrm_reward.py --n_samples_per_prompt 8
    GENRM_GRPC_TARGET=genrm-grpc:50051

OpenRLHF calls ``reward_func(queries, prompts, labels)``: ``queries[i]`` is the prompt
plus the generated answer, ``prompts[i]`` the prompt. The samples of one prompt form
one group.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from genrm_cohort_client import SyncCohortClient, score_samples

try:  # OpenRLHF expects tensors; without torch (as in the tests) lists are returned
    import torch

    _as_tensor: Any = torch.tensor
except ImportError:  # pragma: no cover - depends on the environment
    _as_tensor = list

_clients: dict[str, SyncCohortClient] = {}
_lock = threading.Lock()


def _client(target: str) -> SyncCohortClient:
    with _lock:
        if target not in _clients:
            _clients[target] = SyncCohortClient(target)
        return _clients[target]


def reward_func(
    queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
) -> dict[str, Any]:
    """Rewards in sample order, plus the masked fraction in ``extra_logs``.

    A masked sample (the judge failed for its group) gets the mean reward of the
    unmasked members of its group, so its group-relative advantage is zero; the share of
    masked samples is logged as ``genrm_masked_fraction`` — never a silent 0.0.
    """
    answers = [
        query[len(prompt) :] if query.startswith(prompt) else query
        for query, prompt in zip(queries, prompts, strict=True)
    ]
    scores = score_samples(
        _client(os.environ.get("GENRM_GRPC_TARGET", "127.0.0.1:50051")),
        prompts,
        answers,
        timeout=float(os.environ.get("GENRM_GRPC_TIMEOUT_S", "3600")),
    )
    rewards = scores.rewards_with_masked_as_group_mean()
    masked = scores.masked_count / max(1, len(rewards))
    return {
        "rewards": _as_tensor(rewards),
        "scores": _as_tensor(rewards),
        "extra_logs": {"genrm_masked_fraction": _as_tensor([masked] * len(rewards))},
    }
