"""What judged passes become: a cohort's rewards, and each pass's journal entry."""

from __future__ import annotations

from collections.abc import Sequence

from genrm_grpc.cohort.model import (
    Cohort,
    CohortKey,
    Completed,
    MemberReward,
    comparisons_by_member,
)
from genrm_grpc.cohort.records import VerdictRecord
from genrm_grpc.judge.client import JudgeOutcome
from genrm_grpc.runtime.live import Live, PairResult, RuntimeView, usage_metrics
from genrm_grpc.runtime.plan import Pass
from genrm_grpc.scoring import aggregate
from genrm_grpc.scoring.types import AnswerTexts


def scored(
    config: RuntimeView, cohort: Cohort, results: Sequence[PairResult], live: Live | None = None
) -> Completed:
    """A frozen cohort's outcome from its judged passes, aggregated exactly as NeMo Gym
    does (``live`` counts the passes reused and resumed)."""
    members = cohort.snapshot
    assert members is not None
    texts = [m.candidate.texts for m in members]
    judged = tuple(r.pair for r in results)
    params = config
    if config.comparison_mode == "fixed_baseline":
        baseline = AnswerTexts("", cohort.prompt.baseline_response or "")
        scores = aggregate(texts, judged, params, baseline=baseline)
    else:
        scores = aggregate(texts, judged, params)
    metrics = dict(scores.metrics)
    metrics.update(usage_metrics([r.usage for r in results]))
    by_member = comparisons_by_member(len(scores.members), judged)
    rewards = tuple(
        MemberReward(
            reward=s.reward,
            score_raw=s.score_raw,
            overall_score=s.overall_score,
            length_adjustment=s.length_adjustment,
            comparisons=by_member[k],
        )
        for k, s in enumerate(scores.members)
    )
    return Completed(
        rewards=rewards,
        metrics=metrics,
        judged=judged,
        passes_reused=live.reused if live is not None else 0,
        passes_resumed=live.resumed if live is not None else 0,
    )


def verdict_record(
    key: CohortKey,
    job: Pass,
    question: tuple[str, str, str],
    out: JudgeOutcome,
    finished_at: float,
) -> VerdictRecord:
    """The journal entry of a pass the judge answered (the question it was asked),
    at ``finished_at`` (wall-clock seconds, the runtime's)."""
    context, first, second = question
    usage = out.usage
    return VerdictRecord(
        cohort=key,
        scope=key.group_scope,
        context=context,
        first=first,
        second=second,
        judge_index=job.judge_index,
        swap=job.swap,
        response_i=job.i,
        response_j=job.j,
        verdict=out.verdict,
        usage=None
        if usage is None
        else (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens),
        finished_at=finished_at,
    )
