"""OpenRLHF 0.11 reward function backed by genrm-grpc (see docs/integrations.md).

    GENRM_GRPC_TARGET=genrm-grpc:50051 GENRM_OPENRLHF_GROUP_SIZE=8 \\
    python -m openrlhf.cli.train_ppo_ray ... \\
      --reward.remote_url integrations/openrlhf/genrm_reward.py \\
      --rollout.n_samples_per_prompt 8 --algo.advantage.estimator group_norm

OpenRLHF (``openrlhf/utils/agent.py``) calls ``reward_func([query], [prompt], [label])``
once per sample, in a thread (``asyncio.to_thread``), as soon as that sample is
generated; the n samples of a prompt run concurrently in one rollout process and carry
no index. This module gathers them: per process, the calls of one prompt text fill a
group in arrival order (rollout positions 0..n-1) under the group id
``openrlhf/<run nonce>/<sequence number>``; each call submits its sample to
``SubmitMember`` and blocks until the whole group is judged. Never a group of one,
never a partial group: a sample is judged only with n - 1 siblings.

A call whose prompt and answer equal a sample of the prompt's latest group that is
still open (and whose call has already returned, i.e. a retry) or that completed less
than ``GENRM_OPENRLHF_REPLAY_S`` ago resubmits that very member: genrm-grpc replays its
reward. A later group of the same prompt gets a new sequence number, and a new process
(a resumed run) a new nonce, so neither can meet an earlier group's rewards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
import time
from typing import Any

from genrm_cohort_client import CohortError, SyncCohortClient, uuid7

try:  # OpenRLHF expects tensors; without torch lists are returned
    import torch

    def _as_tensor(values: list[float]) -> Any:
        return torch.tensor(values, dtype=torch.float)

except ImportError:  # pragma: no cover - depends on the environment

    def _as_tensor(values: list[float]) -> Any:
        return list(values)


logger = logging.getLogger("genrm_reward.openrlhf")

#: Every group id minted by this process starts with this (one nonce per process).
RUN_NONCE = str(uuid7())


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class SiblingsMissingError(RuntimeError):
    """The group's other samples never arrived: waiting longer would hang the step."""


class _Group:
    # (A plain class: OpenRLHF loads this file without registering it in sys.modules,
    # where dataclasses would look up its annotations.)
    def __init__(self, group_id: str, size: int) -> None:
        self.group_id = group_id
        self.size = size
        self.answers: list[str] = []
        self.returned: set[int] = set()  # slots whose call has returned
        self.full = threading.Event()
        self.completed_at: float | None = None
        self.failed: str | None = None  # why it can never fill (set with ``full``)


class GroupBuffer:
    """Assigns each per-sample call a (group_id, rollout_index) slot; see the module doc."""

    def __init__(self, group_size: int, replay_s: float, clock: Any = time.monotonic) -> None:
        if group_size < 2:
            raise ValueError(
                "GENRM_OPENRLHF_GROUP_SIZE must be --rollout.n_samples_per_prompt (>= 2)"
            )
        self.group_size = group_size
        self.replay_s = replay_s
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[str, _Group] = {}  # prompt text -> its latest group
        self._sequence = itertools.count()
        self.waiting = 0  # calls blocked until their group is full

    def claim(self, prompt: str, answer: str) -> tuple[_Group, int, bool]:
        """(group, rollout index, is_retry) for one call."""
        with self._lock:
            group = self._latest.get(prompt)
            if group is not None:
                for index, known in enumerate(group.answers):
                    if known != answer or index not in group.returned:
                        continue
                    recent = (
                        group.completed_at is None
                        or self._clock() - group.completed_at <= self.replay_s
                    )
                    if recent:
                        group.returned.discard(index)
                        return group, index, True
                if group.failed is not None and len(group.answers) < group.size:
                    raise _fail(group.failed)
                if len(group.answers) < group.size:
                    group.answers.append(answer)
                    if len(group.answers) == group.size:
                        group.full.set()
                    return group, len(group.answers) - 1, False
            group = _Group(f"openrlhf/{RUN_NONCE}/{next(self._sequence)}", self.group_size)
            group.answers.append(answer)
            self._latest.pop(prompt, None)
            self._latest[prompt] = group
            self._prune()
            return group, 0, False

    def poison(self, group: _Group, message: str) -> None:
        """The group cannot fill: its waiting members and later arrivals fail too."""
        with self._lock:
            if not group.full.is_set():
                group.failed = message
                group.completed_at = self._clock()  # forgotten after the replay window
                group.full.set()

    def release(self, group: _Group, index: int, completed: bool) -> None:
        with self._lock:
            group.returned.add(index)
            if completed and group.completed_at is None:
                group.completed_at = self._clock()

    def _prune(self) -> None:
        # Completed groups older than the replay window are forgotten, oldest first
        # (dicts keep insertion order and a prompt's new group is inserted last), so a
        # call does work only for the groups it forgets.
        now = self._clock()
        while self._latest:
            prompt, group = next(iter(self._latest.items()))
            if group.completed_at is None or now - group.completed_at <= self.replay_s:
                break
            del self._latest[prompt]


_clients: dict[str, SyncCohortClient] = {}
_buffers: dict[tuple[int, float], GroupBuffer] = {}
_lock = threading.Lock()


def _client(target: str) -> SyncCohortClient:
    with _lock:
        if target not in _clients:
            _clients[target] = SyncCohortClient(target)
        return _clients[target]


def _buffer() -> GroupBuffer:
    key = (_env_int("GENRM_OPENRLHF_GROUP_SIZE", 0), _env_float("GENRM_OPENRLHF_REPLAY_S", 120))
    with _lock:
        if key not in _buffers:
            _buffers[key] = GroupBuffer(*key)
        return _buffers[key]


def _size_callers_pool() -> None:
    """Give the loop that loads this file a thread pool that fits the waiting calls.

    OpenRLHF loads the file inside its rollout actor's running event loop and calls
    ``reward_func`` through that loop's default executor (``min(32, cpus + 4)`` threads).
    Each call blocks a thread until its group is full, so with more than that many
    samples of unfinished groups the remaining siblings could never start. A pool of
    ``GENRM_OPENRLHF_THREADS`` (4096) threads replaces it; an idle pool thread costs
    nothing, a blocked one only its stack.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # not loaded by OpenRLHF's actor: the caller sizes its own threads
    threads = _env_int("GENRM_OPENRLHF_THREADS", 4096)
    loop.set_default_executor(
        concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="genrm-reward")
    )
    global _pool_threads
    _pool_threads = threads


_pool_threads: int | None = None
_size_callers_pool()


def _fail(message: str) -> SiblingsMissingError:
    logger.error("genrm reward: %s", message)
    return SiblingsMissingError(message)


def reward_func(
    queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any
) -> dict[str, Any]:
    """The reward of one sample (OpenRLHF's batch of 1), judged with its whole group.

    ``extra_logs["genrm_masked"]`` is 1.0 for a masked sample (the judge failed for its
    group, so genrm-grpc masks every member): the reward is 0.0 for all n, so under
    group_norm / rloo / reinforce_baseline / dr_grpo every advantage of the group is zero.
    """
    if len(queries) != 1:  # waiting per sample in one thread would wait for itself
        raise ValueError(f"genrm reward: expected OpenRLHF's batch of 1, got {len(queries)}")
    query, prompt = queries[0], prompts[0]
    answer = query[len(prompt) :] if query.startswith(prompt) else query
    buffer = _buffer()
    sibling_timeout = _env_float("GENRM_OPENRLHF_SIBLING_TIMEOUT_S", 600)
    group, index, _retry = buffer.claim(prompt, answer)
    completed = False
    try:
        with _lock:
            buffer.waiting += 1
            waiting = buffer.waiting
        try:
            if _pool_threads is not None and waiting >= _pool_threads and not group.full.is_set():
                message = (
                    f"{waiting} reward calls are waiting for their groups and the thread pool"
                    f" has {_pool_threads} threads: no sibling can start. Raise"
                    " GENRM_OPENRLHF_THREADS above the samples a rollout process holds"
                    " (rollout batch x n_samples_per_prompt / engines)."
                )
                buffer.poison(group, message)
            elif not group.full.wait(sibling_timeout):
                buffer.poison(
                    group,
                    f"group {group.group_id} (prompt {prompt[:60]!r}) has"
                    f" {len(group.answers)} of {group.size} samples after {sibling_timeout:g} s:"
                    " the other samples of this prompt are not arriving in this process."
                    " Check that GENRM_OPENRLHF_GROUP_SIZE equals"
                    " --rollout.n_samples_per_prompt, that a prompt's samples are generated"
                    " concurrently (OpenRLHF's generate_responses), and raise"
                    " GENRM_OPENRLHF_SIBLING_TIMEOUT_S if generation lengths differ by more.",
                )
            if group.failed is not None:
                raise _fail(group.failed)
        finally:
            with _lock:
                buffer.waiting -= 1
        member = {
            "group_id": group.group_id,
            "group_attempt": 0,
            "rollout_index": index,
            "group_size": group.size,
        }
        result = _client(os.environ.get("GENRM_GRPC_TARGET", "127.0.0.1:50051")).submit_member(
            member,
            prompt,
            group.answers[index],
            timeout=_env_float("GENRM_GRPC_TIMEOUT_S", 3600),
        )
        completed = True
    except CohortError as exc:
        logger.error("genrm reward: %s for group %s", exc, group.group_id)
        raise
    finally:
        buffer.release(group, index, completed)
    masked = bool(result.mask_sample)
    # genrm-grpc masks a whole group when its judge fails: every member gets the same
    # placeholder 0.0, i.e. equal rewards, zero group-relative advantage.
    reward = 0.0 if masked else float(result.reward)
    return {
        "rewards": _as_tensor([reward]),
        "scores": _as_tensor([reward]),
        "extra_logs": {
            "genrm_masked": _as_tensor([float(masked)]),
            "genrm_replayed": _as_tensor([float(result.replayed)]),
        },
    }
