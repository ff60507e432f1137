"""Wire messages ⇄ core values. Nothing here decides anything."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_grpc.cohort.identity import CandidateInput
from genrm_grpc.cohort.model import (
    Cohort,
    Completed,
    Failed,
    Masked,
    MemberCoords,
    Outcome,
    Phase,
    PromptSpec,
    Tombstone,
)
from genrm_grpc.scoring.types import JudgedPair

PHASE_TO_PROTO = {
    Phase.COLLECTING: pb.COHORT_PHASE_COLLECTING,
    Phase.EVALUATING: pb.COHORT_PHASE_EVALUATING,
    Phase.COMPLETED: pb.COHORT_PHASE_COMPLETED,
    Phase.FAILED: pb.COHORT_PHASE_FAILED,
}


def coords_from_proto(ref: pb.MemberRef) -> MemberCoords:
    return MemberCoords(
        rollout_index=ref.rollout_index,
        group_id=ref.group_id if ref.HasField("group_id") else None,
        group_attempt=ref.group_attempt if ref.HasField("group_attempt") else None,
        task_index=ref.task_index if ref.HasField("task_index") else None,
        prompt_id=ref.prompt_id if ref.HasField("prompt_id") else None,
        group_size=ref.group_size if ref.HasField("group_size") else None,
    )


def coords_to_proto(coords: MemberCoords) -> pb.MemberRef:
    ref = pb.MemberRef(rollout_index=coords.rollout_index)
    if coords.group_id is not None:
        ref.group_id = coords.group_id
    if coords.group_attempt is not None:
        ref.group_attempt = coords.group_attempt
    if coords.task_index is not None:
        ref.task_index = coords.task_index
    if coords.prompt_id is not None:
        ref.prompt_id = coords.prompt_id
    if coords.group_size is not None:
        ref.group_size = coords.group_size
    return ref


def prompt_from_proto(prompt: pb.Prompt) -> PromptSpec:
    return PromptSpec(
        messages=tuple((m.role, m.content) for m in prompt.messages),
        principle=prompt.principle if prompt.HasField("principle") else None,
        baseline_response=(
            prompt.baseline_response if prompt.HasField("baseline_response") else None
        ),
    )


def candidate_from_proto(candidate: pb.Candidate) -> CandidateInput:
    return CandidateInput(
        output_text=candidate.output_text,
        reasoning_text=candidate.reasoning_text,
        responses_api_json=candidate.responses_api_json,
    )


def verdicts_to_proto(pairs: Iterable[JudgedPair]) -> list[pb.PairVerdict]:
    return [
        pb.PairVerdict(
            response_i=p.response_i,
            response_j=p.response_j,
            judge_index=p.judge_index,
            score_1=p.verdict.score_1,
            score_2=p.verdict.score_2,
            ranking=p.verdict.ranking,
            parse_failed=p.verdict.parse_failed,
        )
        for p in pairs
    ]


def member_result(
    coords: MemberCoords, outcome: Completed | Masked, *, replayed: bool
) -> pb.MemberResult:
    """The wire result of one member of a completed (possibly masked) cohort."""
    result = pb.MemberResult(
        member=coords_to_proto(coords),
        replayed=replayed,
        judge_passes_reused=outcome.passes_reused,
        judge_passes_resumed=outcome.passes_resumed,
    )
    result.group_metrics.update(_metrics(outcome.metrics))
    if isinstance(outcome, Masked):
        result.mask_sample = True
        result.failure_kind = pb.FAILURE_KIND_JUDGE_FAILED
        result.failure_reason = outcome.reason
        result.reward = 0.0
        return result
    reward = outcome.rewards[coords.rollout_index]
    result.reward = reward.reward
    result.reward_score_raw = reward.score_raw
    result.reward_overall_score_raw = reward.score_raw
    result.reward_overall_score = reward.overall_score
    result.reward_length_adjustment = reward.length_adjustment
    # Built in place: extend() would copy each PairVerdict built beforehand.
    add = result.comparisons.add
    for p in reward.comparisons:
        verdict = p.verdict
        add(
            response_i=p.response_i,
            response_j=p.response_j,
            judge_index=p.judge_index,
            score_1=verdict.score_1,
            score_2=verdict.score_2,
            ranking=verdict.ranking,
            parse_failed=verdict.parse_failed,
        )
    return result


def _metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def cohort_info(
    cohort: Cohort | Tombstone,
    *,
    latest_attempt: int | None,
    now: float,
    passes: tuple[int, int] = (0, 0),
    judge: tuple[int, int] = (0, 0),
) -> pb.CohortInfo:
    """``passes``: (reused, resumed) so far, for an active cohort (a terminal one's
    outcome carries its own); ``judge``: (comparisons in flight, tokens streamed), from
    the runtime."""
    if isinstance(cohort, Cohort):
        phase = cohort.phase
        present = sorted(cohort.members)
        outcome: Outcome | None = cohort.outcome
        if phase is Phase.COLLECTING:
            remaining = cohort.collection_deadline - now
        elif phase is Phase.EVALUATING and cohort.evaluation_deadline is not None:
            remaining = cohort.evaluation_deadline - now
        else:
            remaining = 0.0
    else:
        outcome = cohort.outcome
        phase = Phase.FAILED if isinstance(outcome, Failed) else Phase.COMPLETED
        present = sorted(cohort.digests)  # only for operators: rebuilt on demand
        remaining = 0.0
    reason = outcome.reason if isinstance(outcome, Failed | Masked) else ""
    if isinstance(outcome, Completed | Masked):
        passes = (outcome.passes_reused, outcome.passes_resumed)
    return pb.CohortInfo(
        key=str(cohort.key),
        phase=PHASE_TO_PROTO[phase],
        group_size=cohort.group_size,
        present_indices=present,
        latest_attempt=latest_attempt if latest_attempt is not None else cohort.key.attempt,
        failure_reason=reason,
        seconds_to_deadline=max(0.0, remaining),
        judge_passes_reused=passes[0],
        judge_passes_resumed=passes[1],
        judge_in_flight=judge[0],
        judge_tokens_streamed=judge[1],
    )
