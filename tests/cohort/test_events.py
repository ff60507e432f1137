"""Group events are values and ``events.apply`` is the one way a runtime decides them."""

from __future__ import annotations

import logging

import pytest

from genrm_grpc.cohort import events
from genrm_grpc.cohort.decisions import SubmitDecision
from genrm_grpc.cohort.model import Phase
from genrm_grpc.cohort.records import Record
from tests.cohort.support import T0, completed, registry, sub


def _records(script: list[tuple[events.GroupEvent, float]]) -> list[Record]:
    reg, _ = registry()
    out: list[Record] = []
    for event, now in script:
        decided = events.apply(reg, event, now)
        if decided is not None and not isinstance(decided, events.NotActive):
            out += decided.records
    return out


def test_replaying_the_same_events_gives_the_same_records() -> None:
    key = sub(0).key
    script: list[tuple[events.GroupEvent, float]] = [
        (events.MemberArrived(sub(0)), T0),
        (events.MemberArrived(sub(1)), T0 + 0.1),
        (events.MemberArrived(sub(2)), T0 + 0.2),
        (events.Judged(key, None, completed(3)), T0 + 1),
    ]
    first, again = _records(script), _records(list(script))
    assert first == again and len(first) > 4
    assert script == list(script)  # events compare by value
    assert "MemberArrived(sub=Submission(" in repr(script[0][0])  # and print as such


def test_an_event_for_a_cohort_that_is_gone_or_replaced_is_not_applied() -> None:
    reg, _ = registry()
    first = events.apply(reg, events.MemberArrived(sub(0, gid=None)), T0)
    assert isinstance(first, SubmitDecision) and first.cohort is not None
    stale_seq = first.cohort.seq
    ended = events.apply(reg, events.Cancelled(first.cohort.key, stale_seq, "operator"), T0)
    assert ended and first.cohort.phase is Phase.FAILED
    # A later cohort under the same legacy key: an event meant for the first misses it.
    later = events.apply(reg, events.MemberArrived(sub(0, gid=None)), T0 + 1e6)  # unfenced
    assert isinstance(later, SubmitDecision) and later.cohort is not None
    assert later.cohort.key == first.cohort.key and later.cohort.seq != stale_seq
    missed = events.apply(reg, events.Cancelled(later.cohort.key, stale_seq, "late"), T0 + 1e6)
    assert missed is events.NOT_ACTIVE
    assert later.cohort.phase is Phase.COLLECTING
    gone = events.apply(reg, events.DeadlinePassed(sub(0, gid="other").key), T0 + 1e6)
    assert gone is events.NOT_ACTIVE


def test_a_deadline_event_applies_the_deadline_of_the_cohorts_phase() -> None:
    reg, _ = registry()
    events.apply(reg, events.MemberArrived(sub(0)), T0)
    cohort = reg.active(sub(0).key)
    assert cohort is not None
    assert events.apply(reg, events.DeadlinePassed(cohort.key), T0 + 1) is None  # not yet
    ended = events.apply(reg, events.DeadlinePassed(cohort.key, cohort.seq), 1e12)
    assert ended and cohort.phase is Phase.FAILED  # collecting: the collection deadline


def test_at_debug_each_applied_event_is_logged_by_kind_and_cohort_without_its_texts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg, _ = registry()
    event = events.MemberArrived(sub(0, text="the-answer " * 500))
    with caplog.at_level(logging.DEBUG, logger="genrm_grpc.cohort.events"):
        events.apply(reg, event, T0)
    [line] = [r for r in caplog.records if r.name == "genrm_grpc.cohort.events"]
    assert line.__dict__["event"] == "MemberArrived" and line.__dict__["now"] == T0
    assert line.__dict__["cohort"] == str(event.sub.key)
    assert "the-answer" not in repr(line.__dict__)  # no bodies in the line
