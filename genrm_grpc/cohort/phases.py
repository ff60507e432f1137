"""The cohort phases: one transition table and the one function that applies it.

Every change of a cohort's phase goes through :func:`transition`; a pair that is not in
the table is a bug in the caller and raises :class:`IllegalTransition` instead of
leaving a cohort in a phase no rule expects (a published cohort that starts judging, an
evaluating cohort that takes a member). Every "may this happen now?" question (a late
timer, a stale judge result, a member for a closed cohort) is :func:`allows` on the
same table.

::

    COLLECTING --JOINED--------------------------> COLLECTING
    COLLECTING --FILLED--------------------------> EVALUATING
    COLLECTING --COLLECTION_EXPIRED|SUPERSEDED|CANCELLED--> FAILED
    EVALUATING --JUDGED|JUDGE_FAILED|EVALUATION_EXPIRED----> COMPLETED
    EVALUATING --SUPERSEDED|CANCELLED|AGGREGATION_FAILED---> FAILED

``JUDGE_FAILED`` and ``EVALUATION_EXPIRED`` complete the cohort with a *masked*
outcome: the members get a result with ``mask_sample`` set, never a made-up reward.
``COMPLETED`` and ``FAILED`` are terminal: nothing leaves them.
"""

from __future__ import annotations

import enum

from genrm_grpc.cohort.model import Phase


class Event(enum.Enum):
    """What can happen to a cohort."""

    JOINED = "joined"  # a member arrived and others are still missing
    FILLED = "filled"  # its last missing member arrived (also: restored as filled)
    COLLECTION_EXPIRED = "collection_expired"
    SUPERSEDED = "superseded"  # a newer attempt of its group arrived
    CANCELLED = "cancelled"  # operator action or shutdown without a durable store
    JUDGED = "judged"  # every pass judged and aggregated
    JUDGE_FAILED = "judge_failed"  # a pass failed for good: masked
    EVALUATION_EXPIRED = "evaluation_expired"  # masked
    AGGREGATION_FAILED = "aggregation_failed"


_C, _E = Phase.COLLECTING, Phase.EVALUATING

TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (_C, Event.JOINED): _C,
    (_C, Event.FILLED): _E,
    (_C, Event.COLLECTION_EXPIRED): Phase.FAILED,
    (_C, Event.SUPERSEDED): Phase.FAILED,
    (_C, Event.CANCELLED): Phase.FAILED,
    (_E, Event.JUDGED): Phase.COMPLETED,
    (_E, Event.JUDGE_FAILED): Phase.COMPLETED,
    (_E, Event.EVALUATION_EXPIRED): Phase.COMPLETED,
    (_E, Event.SUPERSEDED): Phase.FAILED,
    (_E, Event.CANCELLED): Phase.FAILED,
    (_E, Event.AGGREGATION_FAILED): Phase.FAILED,
}


class IllegalTransition(RuntimeError):
    """A cohort was asked to change phase in a way the table does not allow."""


def transition(phase: Phase, event: Event) -> Phase:
    """The phase ``event`` leads to from ``phase``; raises for any pair not in the table."""
    try:
        return TRANSITIONS[(phase, event)]
    except KeyError:
        raise IllegalTransition(
            f"a {phase.value} cohort cannot take the event {event.value}"
        ) from None


def allows(phase: Phase, event: Event) -> bool:
    """True when ``event`` may happen to a cohort in ``phase`` (late timers, stale results)."""
    return (phase, event) in TRANSITIONS
