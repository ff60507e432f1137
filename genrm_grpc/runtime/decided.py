"""What one round of decisions on one group decided, and how its callers get it.

``runtime/group_decisions.py`` reads a group, decides a round of events on it in a
one-group registry (:func:`decide_ops`) and commits what :class:`Decided` holds; each
event's caller waits on its :class:`Op` and gets its own decision (:func:`answer`), or
the error that failed the round (:func:`fail`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from genrm_grpc.cohort.events import Decision, GroupEvent, NotActive, apply
from genrm_grpc.cohort.model import Cohort, CohortKey, Tombstone
from genrm_grpc.cohort.records import Record, TombstoneRecord
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, Ended, SubmitDecision
from genrm_grpc.store.records import StoreError

log = logging.getLogger("genrm_grpc.runtime.group_decisions")

#: The event that ends a frozen cohort needing no judge call (its score), or None to
#: judge it under its lease.
Settle = Callable[[Cohort], GroupEvent | None]


@dataclass(eq=False, slots=True)
class Op:
    """One event to decide, and the future its caller waits on for its decision."""

    event: GroupEvent
    future: asyncio.Future[Decision | NotActive]


@dataclass(slots=True)
class Decided:
    """The ops of one round on one group, decided: each op's result, and what to commit."""

    decisions: list[Decision | NotActive | Exception] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    ended: list[Cohort] = field(default_factory=list)
    frozen: Cohort | None = None

    def started(self, before: frozenset[CohortKey]) -> list[CohortKey]:
        """The cohorts these decisions created (not active ``before``), once each, ended
        in the same decision or not (a store may then have been given no header)."""
        created: dict[CohortKey, None] = {}
        for decision in self.decisions:
            if (
                isinstance(decision, SubmitDecision)
                and decision.disposition is Disposition.ACCEPTED
                and decision.cohort is not None
                and decision.cohort.key not in before
            ):
                created[decision.cohort.key] = None
        return list(created)

    def mailboxes(self, now: float) -> list[Tombstone]:
        """What the outcome mailboxes keep of the ended cohorts: the tombstone the
        decision wrote (its record made once serves both), or the cohort's outcome when
        it left none (a completed legacy cohort)."""
        written = {
            r.tombstone.key: r.tombstone for r in self.records if isinstance(r, TombstoneRecord)
        }
        boxes = []
        for cohort in self.ended:
            tomb = written.get(cohort.key)
            boxes.append(tomb if tomb is not None else mailbox(cohort, now))
        return boxes


def decide_ops(
    key: CohortKey,
    ops: list[Op],
    registry: CohortRegistry,
    now: float,
    settle: Settle | None = None,
) -> Decided:
    # The round's records are taken once, at its end (a registry that defers them).
    assert registry.defer_records, "decide_ops needs GroupDecisions.group_registry()"
    done = Decided()
    for op in ops:
        try:
            decision = apply(registry, op.event, now)
        except Exception as exc:  # one member's bug must not fail its neighbours
            log.exception("deciding an event of cohort %s failed", key)
            done.decisions.append(exc)
            continue
        done.decisions.append(decision)
        if decision is None or isinstance(decision, NotActive):
            continue
        if isinstance(decision, SubmitDecision):
            done.ended.extend(decision.ended)
            if decision.frozen:
                done.frozen = decision.cohort
                _settle(done, registry, now, settle)
        else:
            done.ended.extend(decision)
    # What the store needs of the round: a cohort created and filled has one header,
    # one created and ended (a 1-member group, scored) none (``end_state``).
    done.records = registry.take_records()
    return done


def _settle(done: Decided, registry: CohortRegistry, now: float, settle: Settle | None) -> None:
    """A frozen cohort that needs no judge call ends in the same decision (one commit)."""
    cohort = done.frozen
    event = settle(cohort) if settle is not None and cohort is not None else None
    if event is None:
        return
    ended = apply(registry, event, now)
    if isinstance(ended, Ended) and ended:
        done.ended.extend(ended)
        done.frozen = None


def fail(ops: list[Op], exc: BaseException) -> None:
    for op in ops:
        if not op.future.done():
            op.future.set_exception(exc if isinstance(exc, Exception) else StoreError("cancelled"))
            op.future.exception()


def answer(ops: list[Op], decisions: list[Decision | NotActive | Exception]) -> None:
    for op, result in zip(ops, decisions, strict=True):
        if op.future.done():
            continue
        if isinstance(result, Exception):
            op.future.set_exception(result)
            op.future.exception()
        else:
            op.future.set_result(result)


def mailbox(cohort: Cohort, now: float) -> Tombstone:
    """What the outcome mailbox keeps of an ended cohort: its outcome."""
    assert cohort.outcome is not None
    return Tombstone(
        key=cohort.key,
        group_size=cohort.group_size,
        prompt_digest=cohort.prompt_digest,
        digests={},
        outcome=cohort.outcome,
        finished_at=now,
    )
