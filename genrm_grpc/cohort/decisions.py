"""What the registry answers a submission with, every refusal it can make, and the
outcome of a cohort that ends without rewards.

``SubmitDecision`` and ``Ended`` carry a decision to the runtime; the refusals and the
failure outcomes are pure functions of the submission or cohort (and of the limit they
cite). ``terminal_decision`` is the one rule decided here, because it depends on the
tombstone alone: what a member of a cohort that has ended gets. Every other rule, which
reads the registry's state, is ``genrm_grpc.cohort.registry``'s; it re-exports the
names other modules use.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from genrm_grpc.cohort.identity import coords_metadata
from genrm_grpc.cohort.model import (
    LEGACY_RETRY_ADVICE,
    MAX_FAILURE_REASON,
    Cohort,
    CohortKey,
    Failed,
    Masked,
    Phase,
    Reason,
    Rejection,
    Submission,
    Tombstone,
    clip,
    clip_reason,
)
from genrm_grpc.cohort.records import Record


class Disposition(enum.Enum):
    ACCEPTED = "accepted"  # new slot filled
    ATTACHED = "attached"  # identical resubmission of an active member
    REPLAYED = "replayed"  # identical resubmission after completion
    REJECTED = "rejected"


@dataclass(slots=True)
class SubmitDecision:
    disposition: Disposition
    cohort: Cohort | None = None
    rejection: Rejection | None = None
    replay: Tombstone | None = None
    #: True when this member filled the last slot: the cohort is now evaluating.
    frozen: bool = False
    #: Cohorts that this submission ended (older attempts it superseded, or its own
    #: cohort when the collection deadline had already passed). Publish their outcomes.
    ended: list[Cohort] = field(default_factory=list)
    #: What the decision changed, to persist before any answer that depends on it.
    records: list[Record] = field(default_factory=list)


class Ended(list[Cohort]):
    """Cohorts an event ended (publish their outcomes) and the records to persist first.

    Empty — and so false — when the event changed nothing (a late timer, a stale result).
    """

    def __init__(self, cohorts: list[Cohort], records: list[Record]) -> None:
        super().__init__(cohorts)
        self.records = records


def terminal_decision(tomb: Tombstone, sub: Submission) -> SubmitDecision:
    """What a member of a cohort that has ended gets: its replayed result, or a refusal
    (and a fenced legacy key's masked result for any member)."""
    if tomb.prompt_digest != sub.prompt_digest or tomb.group_size != sub.group_size:
        return mismatch(sub, tomb.group_size, tomb.prompt_digest)
    if not tomb.key.explicit and tomb.masked:
        # A fenced legacy key: every later member for it, whatever its answer, gets
        # the recorded masked result (whose reason advises a fresh group_id). No
        # judge call, and no new cohort that could mix a delayed member of the
        # failed run with its replacement.
        return SubmitDecision(Disposition.REPLAYED, replay=tomb)
    digest = tomb.digest_at(sub.rollout_index)
    if digest is not None and digest != sub.candidate.digest:
        return slot_conflict(sub)
    failed = tomb.failed
    if failed is not None:
        return failed_cohort(sub, failed)
    if digest is None:
        return closed(sub, Phase.COMPLETED)
    return SubmitDecision(Disposition.REPLAYED, replay=tomb)


def refuse(reason: Reason, message: str, sub: Submission, **meta: str) -> SubmitDecision:
    """A refusal with the member's coordinates (and ``meta``) as ErrorInfo metadata."""
    rejection = Rejection(reason, message, coords_metadata(sub.coords, **meta))
    return SubmitDecision(Disposition.REJECTED, rejection=rejection)


def mismatch(sub: Submission, group_size: int, digest: str) -> SubmitDecision:
    if group_size != sub.group_size:
        what = f"group_size {sub.group_size} differs from the cohort's {group_size}"
    else:
        what = (
            f"the prompt (digest {sub.prompt_digest[:12]}) differs from the cohort's "
            f"(digest {digest[:12]})"
        )
    return refuse(Reason.PROMPT_MISMATCH, f"cohort {sub.key}: {what}", sub)


def slot_conflict(sub: Submission) -> SubmitDecision:
    return refuse(
        Reason.SLOT_CONFLICT,
        f"cohort {sub.key}: slot {sub.rollout_index} already holds a different response",
        sub,
    )


def closed(sub: Submission, phase: Phase) -> SubmitDecision:
    return refuse(
        Reason.COHORT_CLOSED,
        f"cohort {sub.key} is {phase.value}; it accepts no new members",
        sub,
    )


def failed_cohort(sub: Submission, outcome: Failed) -> SubmitDecision:
    return SubmitDecision(
        Disposition.REJECTED,
        rejection=failure_rejection(sub.key, outcome, coords_metadata(sub.coords)),
    )


def capacity_exhausted(sub: Submission, max_active_cohorts: int) -> SubmitDecision:
    return refuse(
        Reason.CAPACITY_EXHAUSTED,
        f"the server holds max_active_cohorts={max_active_cohorts} active cohorts; retry later",
        sub,
    )


def principal_quota_exhausted(sub: Submission, quota: int | None) -> SubmitDecision:
    return refuse(
        Reason.CAPACITY_EXHAUSTED,
        f"principal {sub.key.principal!r} holds max_active_cohorts_per_principal="
        f"{quota} active cohorts; retry later",
        sub,
        principal=sub.key.principal,
    )


def shutting_down(sub: Submission) -> SubmitDecision:
    return refuse(
        Reason.SHUTTING_DOWN, "the server is shutting down; retry on another replica", sub
    )


def failure_rejection(key: CohortKey, outcome: Failed, meta: Mapping[str, str]) -> Rejection:
    """The ABORTED/COHORT_FAILED refusal for members of a failed cohort.

    The key and reason are clipped so that the whole message, and the legacy advice at
    its end, fits the status message bound.
    """
    message = f"cohort {clip(str(key), 160)} failed: {clip(outcome.reason, 560)}"
    if outcome.legacy:
        message = f"{message}. {LEGACY_RETRY_ADVICE}"
    return Rejection(Reason.COHORT_FAILED, message, dict(meta))


# --------------------------------------------------------------------------------------
# The outcomes of a cohort that ends without rewards
# --------------------------------------------------------------------------------------


def collection_expired(cohort: Cohort, timeout_s: float) -> Failed:
    """The failure of a cohort whose collection deadline passed, naming who is missing."""
    missing = [i for i in range(cohort.group_size) if i not in cohort.members]
    shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
    reason = (
        f"collection deadline expired (cohort_collection_timeout_s="
        f"{timeout_s:g}) with {len(cohort.members)}/"
        f"{cohort.group_size} members; missing rollout_index: {shown}"
    )
    return Failed(clip_reason(reason), legacy=not cohort.key.explicit)


def evaluation_expired(timeout_s: float) -> Masked:
    """The masked result of a cohort whose judge did not finish by its deadline."""
    reason = (
        f"judge evaluation deadline expired: cohort_evaluation_timeout_s="
        f"{timeout_s:g} passed before every comparison finished"
    )
    return Masked(reason=clip_reason(reason))


def legacy_outcome(outcome: Failed | Masked) -> Failed | Masked:
    """The outcome a failed legacy cohort records: marked legacy, advice included.

    A masked result carries the advice in its ``failure_reason`` (clipped so the advice
    always survives); a failure gets it appended to its status message.
    """
    if isinstance(outcome, Failed):
        return Failed(outcome.reason, legacy=True)
    room = MAX_FAILURE_REASON - len(LEGACY_RETRY_ADVICE.encode()) - 2
    return Masked(f"{clip(outcome.reason, room)}. {LEGACY_RETRY_ADVICE}", outcome.metrics)
