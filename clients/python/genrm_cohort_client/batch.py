"""Blocking batch scoring for RL frameworks' reward-function hooks (verl, OpenRLHF).

verl's batch reward manager and OpenRLHF's custom ``reward_func`` hand over one flat
batch: every sample carries its prompt and one answer, and the N answers of a prompt
form a GRPO group. :func:`score_groups` takes the prompts with their N answers, mints a
fresh group id per prompt, sends each group on ``StreamGroups`` (bounded concurrency,
one channel) and returns the rewards in input order together with the mask;
:func:`score_samples` does the same for a flat batch, grouping samples by prompt (or by
an explicit group key such as verl's ``uid``).

A masked member (the judge failed for its group, or the group itself failed) is never a
silent zero: ``mask[i][k]`` is true, ``failure_kinds`` and ``failure_reasons`` say why,
and with ``on_masked="raise"`` the call raises :class:`MaskedGroupsError` instead.
Bugs in the request (``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``, ``ALREADY_EXISTS``)
always raise :class:`CohortError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_cohort_client.client import CandidateLike, CohortClient, PromptLike, make_prompt
from genrm_cohort_client.errors import CohortError
from genrm_cohort_client.ids import new_group_id
from genrm_cohort_client.options import ChannelOptions, RetryPolicy
from genrm_cohort_client.sync import SyncCohortClient

__all__ = [
    "BatchScores",
    "MaskedGroupsError",
    "SampleScores",
    "score_groups",
    "score_groups_async",
    "score_samples",
]

logger = logging.getLogger("genrm_cohort_client.batch")

#: The group's judge failed: the server published a masked result (0.0 placeholder).
JUDGE_FAILED = "judge_failed"
#: The group attempt failed (``ABORTED``: deadline, shutdown…) on every attempt allowed.
GROUP_FAILED = "group_failed"


@dataclass(frozen=True)
class BatchScores:
    """Per-group results, in the order of the input groups and of their answers.

    ``rewards[i][k]`` is the reward of answer ``k`` of group ``i``; where
    ``mask[i][k]`` is true it is only the placeholder 0.0 and must not be trained on.
    """

    group_ids: list[str]
    rewards: list[list[float]]
    mask: list[list[bool]]
    failure_kinds: list[list[str]]
    failure_reasons: list[list[str]]
    results: list[list[pb.MemberResult | None]] = field(repr=False)

    @property
    def masked_count(self) -> int:
        return sum(sum(row) for row in self.mask)

    @property
    def total(self) -> int:
        return sum(len(row) for row in self.mask)

    def rewards_with_masked_as_group_mean(self, all_masked: float = 0.0) -> list[list[float]]:
        """Rewards where each masked member gets the mean of its group's unmasked rewards.

        With group-normalised advantages (GRPO) such a member's advantage is zero and the
        others' are unchanged: it neither pushes nor pulls. A wholly masked group gets
        ``all_masked`` for every member (all equal: zero advantage too). For frameworks
        without a per-sample mask; report ``mask`` alongside.
        """
        out = []
        for rewards, mask in zip(self.rewards, self.mask, strict=True):
            kept = [r for r, m in zip(rewards, mask, strict=True) if not m]
            fill = sum(kept) / len(kept) if kept else all_masked
            out.append([fill if m else r for r, m in zip(rewards, mask, strict=True)])
        return out


@dataclass(frozen=True)
class SampleScores:
    """Flat results in the order of the input samples (see :func:`score_samples`)."""

    rewards: list[float]
    mask: list[bool]
    failure_kinds: list[str]
    failure_reasons: list[str]
    group_ids: list[str]
    groups: BatchScores = field(repr=False)
    #: ``(group, answer)`` of each sample in :attr:`groups`.
    positions: list[tuple[int, int]] = field(repr=False, default_factory=list)

    @property
    def masked_count(self) -> int:
        return sum(self.mask)

    def rewards_with_masked_as_group_mean(self, all_masked: float = 0.0) -> list[float]:
        """Flat :meth:`BatchScores.rewards_with_masked_as_group_mean`, in sample order."""
        per_group = self.groups.rewards_with_masked_as_group_mean(all_masked)
        return [per_group[g][k] for g, k in self.positions]


class MaskedGroupsError(RuntimeError):
    """Raised with ``on_masked="raise"`` when any member is masked; carries the scores."""

    def __init__(self, scores: BatchScores) -> None:
        self.scores = scores
        reasons = {r for row in scores.failure_reasons for r in row if r}
        super().__init__(
            f"{scores.masked_count} of {scores.total} members are masked: "
            + "; ".join(sorted(reasons))[:500]
        )


async def score_groups_async(
    client: CohortClient,
    prompts: Sequence[PromptLike],
    answers: Sequence[Sequence[CandidateLike]],
    *,
    principles: Sequence[str | None] | None = None,
    group_id_prefix: str = "",
    concurrency: int = 16,
    timeout: float | None = None,
    max_group_attempts: int = 2,
) -> BatchScores:
    """:func:`score_groups` on an existing asyncio :class:`CohortClient`."""
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answer lists")
    if principles is not None and len(principles) != len(prompts):
        raise ValueError(f"{len(principles)} principles for {len(prompts)} prompts")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if any(len(group) == 0 for group in answers):
        raise ValueError("every prompt needs at least one answer")
    group_ids = [new_group_id(group_id_prefix) for _ in prompts]
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> list[pb.MemberResult] | CohortError:
        principle = principles[i] if principles is not None else None
        prompt = make_prompt(prompts[i], principle=principle)
        async with gate:
            try:
                return await client.evaluate_group_all(
                    prompt,
                    list(answers[i]),
                    group_id=group_ids[i],
                    timeout=timeout,
                    max_group_attempts=max_group_attempts,
                    reuse_answers_on_abort=True,
                )
            except CohortError as exc:
                if exc.code == grpc.StatusCode.ABORTED:
                    return exc  # the group failed on every attempt: masked, reported
                raise

    outcomes = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    rewards: list[list[float]] = []
    mask: list[list[bool]] = []
    kinds: list[list[str]] = []
    reasons: list[list[str]] = []
    results: list[list[pb.MemberResult | None]] = []
    for i, outcome in enumerate(outcomes):
        n = len(answers[i])
        if isinstance(outcome, CohortError):
            reason = str(outcome)[:2000]
            rewards.append([0.0] * n)
            mask.append([True] * n)
            kinds.append([GROUP_FAILED] * n)
            reasons.append([reason] * n)
            results.append([None for _ in range(n)])
            continue
        rows: list[pb.MemberResult | None] = [None] * n
        for result in outcome:
            rows[result.member.rollout_index] = result
        if any(r is None for r in rows):  # the server answers every member or raises
            raise RuntimeError(f"group {group_ids[i]}: results missing for some members")
        done = [r for r in rows if r is not None]
        rewards.append([r.reward for r in done])
        mask.append([r.mask_sample for r in done])
        kinds.append([JUDGE_FAILED if r.mask_sample else "" for r in done])
        reasons.append([r.failure_reason if r.mask_sample else "" for r in done])
        results.append(rows)
    scores = BatchScores(group_ids, rewards, mask, kinds, reasons, results)
    if scores.masked_count:
        logger.warning(
            "genrm: %d of %d members masked (judge or group failure); see BatchScores.mask",
            scores.masked_count,
            scores.total,
        )
    return scores


def score_groups(
    target: str | SyncCohortClient,
    prompts: Sequence[PromptLike],
    answers: Sequence[Sequence[CandidateLike]],
    *,
    principles: Sequence[str | None] | None = None,
    group_id_prefix: str = "",
    concurrency: int = 16,
    timeout: float | None = 3600.0,
    max_group_attempts: int = 2,
    on_masked: Literal["report", "raise"] = "report",
    options: ChannelOptions | None = None,
    retry: RetryPolicy | None = None,
) -> BatchScores:
    """Score ``answers[i]`` (the N answers to ``prompts[i]``) as one group each; blocking.

    ``target`` is a gRPC address (a client is opened and closed for this call) or a
    :class:`SyncCohortClient` to reuse across training steps. Every group gets a fresh
    group id (``group_id_prefix`` + UUIDv7); ``UNAVAILABLE`` is retried per ``retry``,
    and a failed group attempt (``ABORTED``) is resent as the next attempt with the same
    answers up to ``max_group_attempts`` times, then reported as masked
    (``failure_kinds`` = ``"group_failed"``). ``timeout`` bounds each group's stream.
    """
    if on_masked not in ("report", "raise"):
        raise ValueError("on_masked must be 'report' or 'raise'")
    own = isinstance(target, str)
    client = (
        SyncCohortClient(target, options=options, retry=retry)
        if isinstance(target, str)
        else target
    )
    try:
        scores = client._run(
            score_groups_async(
                client.client,
                prompts,
                answers,
                principles=principles,
                group_id_prefix=group_id_prefix,
                concurrency=concurrency,
                timeout=timeout,
                max_group_attempts=max_group_attempts,
            )
        )
    finally:
        if own:
            client.close()
    if on_masked == "raise" and scores.masked_count:
        raise MaskedGroupsError(scores)
    return scores


def score_samples(
    target: str | SyncCohortClient,
    prompts: Sequence[PromptLike],
    answers: Sequence[CandidateLike],
    *,
    group_keys: Sequence[Hashable] | None = None,
    **kwargs: object,
) -> SampleScores:
    """Score a flat batch (one prompt and one answer per sample); rewards in sample order.

    Samples with the same ``group_keys[j]`` (default: the same prompt) form one group,
    in order of first appearance; all samples of a group must share the prompt. Other
    arguments are those of :func:`score_groups`.
    """
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    if group_keys is not None and len(group_keys) != len(prompts):
        raise ValueError(f"{len(group_keys)} group keys for {len(prompts)} samples")
    order: dict[Hashable, int] = {}
    group_prompts: list[PromptLike] = []
    group_answers: list[list[CandidateLike]] = []
    where: list[tuple[int, int]] = []
    for j, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        key = group_keys[j] if group_keys is not None else make_prompt(prompt).SerializeToString()
        g = order.get(key)
        if g is None:
            g = order[key] = len(group_prompts)
            group_prompts.append(prompt)
            group_answers.append([])
        elif make_prompt(prompt) != make_prompt(group_prompts[g]):
            raise ValueError(f"sample {j}: group {key!r} mixes different prompts")
        where.append((g, len(group_answers[g])))
        group_answers[g].append(answer)
    groups = score_groups(target, group_prompts, group_answers, **kwargs)  # type: ignore[arg-type]
    return SampleScores(
        rewards=[groups.rewards[g][k] for g, k in where],
        mask=[groups.mask[g][k] for g, k in where],
        failure_kinds=[groups.failure_kinds[g][k] for g, k in where],
        failure_reasons=[groups.failure_reasons[g][k] for g, k in where],
        group_ids=[groups.group_ids[g] for g, _ in where],
        groups=groups,
        positions=where,
    )
