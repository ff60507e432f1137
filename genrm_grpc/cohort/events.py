"""What can happen to a group, as values, and the one function that applies it.

Every event the runtime hands the registry is one of these frozen dataclasses: a
member arrived, a deadline passed, the judge finished (or failed for good), the
verdicts could not be aggregated, the cohort was cancelled. They compare by value and
print as what they are, so a decision can be logged (at DEBUG, :func:`apply` writes
one line per event: kind, cohort, instant) and replayed: :func:`apply` on the
same registry state with the same events and instants gives the same records (a test
pins it). Events about a cohort name it by key and, when the runtime knows it, by its
``seq`` (the registry's creation number, kept across restarts): an event meant for one
cohort is never applied to a later cohort under the same legacy key.

Operations on the whole registry (restore, draining, failing or suspending every cohort
at shutdown) are not group events and stay methods of the registry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from genrm_grpc.cohort.decisions import Ended, SubmitDecision
from genrm_grpc.cohort.model import CohortKey, Completed, Phase, Submission
from genrm_grpc.cohort.registry import CohortRegistry


@dataclass(frozen=True, slots=True)
class MemberArrived:
    sub: Submission


@dataclass(frozen=True, slots=True)
class DeadlinePassed:
    """The deadline of the cohort's phase (collection, or evaluation) may have passed."""

    key: CohortKey
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class Judged:
    """Every pass was judged and aggregated into ``outcome``."""

    key: CohortKey
    seq: int | None
    outcome: Completed


@dataclass(frozen=True, slots=True)
class JudgeFailed:
    """A pass failed for good: the cohort is masked."""

    key: CohortKey
    seq: int | None
    reason: str
    reused: int = 0
    resumed: int = 0


@dataclass(frozen=True, slots=True)
class AggregationFailed:
    key: CohortKey
    seq: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The cohort fails now: an operator's cancellation, or an evaluation that raised."""

    key: CohortKey
    seq: int | None
    reason: str


GroupEvent = MemberArrived | DeadlinePassed | Judged | JudgeFailed | AggregationFailed | Cancelled


class NotActive:
    """The event names no active cohort (it ended, or a later one holds the key)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_ACTIVE"


NOT_ACTIVE = NotActive()

Decision = SubmitDecision | Ended | None

#: At DEBUG, one line per event applied: its kind, cohort and ``now``.
log = logging.getLogger(__name__)


def apply(registry: CohortRegistry, event: GroupEvent, now: float) -> Decision | NotActive:
    """Decide ``event`` on ``registry`` at ``now``: what it changed (records, cohorts it
    ended), None when it changes nothing, NOT_ACTIVE when its cohort is gone."""
    if log.isEnabledFor(logging.DEBUG):
        _log_event(event, now)
    if isinstance(event, MemberArrived):
        return registry.submit(event.sub, now)
    cohort = registry.active(event.key)
    if cohort is None or (event.seq is not None and cohort.seq != event.seq):
        return NOT_ACTIVE
    match event:
        case DeadlinePassed():
            if cohort.phase is Phase.COLLECTING:
                return registry.collection_deadline(cohort, now)
            return registry.evaluation_deadline(cohort, now)
        case Judged(outcome=outcome):
            return registry.evaluation_finished(cohort, outcome, now)
        case JudgeFailed(reason=reason, reused=reused, resumed=resumed):
            return registry.judge_failed(cohort, reason, now, reused=reused, resumed=resumed)
        case AggregationFailed(reason=reason):
            return registry.aggregation_failed(cohort, reason, now)
        case Cancelled(reason=reason):
            return registry.fail(cohort, reason, now)


def _log_event(event: GroupEvent, now: float) -> None:
    """Kind, cohort and instant (a member's: its slot, never its texts: lines stay short)."""
    fields: dict[str, object] = {"event": type(event).__name__, "now": now}
    if isinstance(event, MemberArrived):
        fields.update(cohort=str(event.sub.key), rollout_index=event.sub.rollout_index)
    else:
        fields.update(cohort=str(event.key), seq=event.seq)
    log.debug("group event", extra=fields)
