"""The cohort phase table, and the records each registry decision carries.

The registry is the only place that changes a cohort's phase (through one transition
table) and the only place that says what must be persisted: each decision lists the
records it changed, with wall-clock instants, so a store replaying them rebuilds the
same state (``restore``).
"""

from __future__ import annotations

import dataclasses

import pytest

from genrm_grpc.cohort.model import Completed, Masked, Phase, Tombstone
from genrm_grpc.cohort.phases import TRANSITIONS, Event, IllegalTransition, transition
from genrm_grpc.cohort.recording import end_state
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    MemberRecord,
    Recovered,
    RecoveredCohort,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.cohort.registry import Disposition
from tests.cohort.support import COLLECTION_S, EVALUATION_S, T0, completed, registry, sub

WALL = 1_700_000_000.0  # the wall clock at T0


def test_terminal_phases_take_no_event_and_every_pair_outside_the_table_is_refused() -> None:
    for phase in Phase:
        for event in Event:
            if (phase, event) in TRANSITIONS:
                assert transition(phase, event) is TRANSITIONS[(phase, event)]
            else:
                with pytest.raises(IllegalTransition):
                    transition(phase, event)
    assert not any(phase in (Phase.COMPLETED, Phase.FAILED) for phase, _ in TRANSITIONS)
    # Only a full cohort starts judging, and judging ends in COMPLETED (possibly masked).
    assert [p for (p, e), to in TRANSITIONS.items() if to is Phase.EVALUATING] == [Phase.COLLECTING]
    assert transition(Phase.EVALUATING, Event.JUDGE_FAILED) is Phase.COMPLETED


def test_members_and_the_filled_header_are_records_with_wall_clock_deadlines() -> None:
    reg, _ = registry()
    reg.wall_offset = WALL - T0
    first = reg.submit(sub(0), T0)
    kinds = [type(r) for r in first.records]
    assert kinds == [WatermarkRecord, CohortRecord, MemberRecord]
    header = first.records[1]
    assert isinstance(header, CohortRecord)
    assert header.phase is Phase.COLLECTING
    assert header.collection_deadline == WALL + COLLECTION_S
    assert reg.submit(sub(0), T0 + 1).records == []  # an identical resend changes nothing
    reg.submit(sub(1), T0 + 1)
    last = reg.submit(sub(2), T0 + 2)
    assert last.frozen
    filled = [r for r in last.records if isinstance(r, CohortRecord)]
    assert len(filled) == 1 and filled[0].phase is Phase.EVALUATING
    assert filled[0].evaluation_deadline == WALL + 2 + EVALUATION_S


def test_an_ended_cohort_is_dropped_and_leaves_a_tombstone_record() -> None:
    reg, _ = registry()
    reg.wall_offset = WALL - T0
    for i in range(3):
        decision = reg.submit(sub(i), T0)
    assert decision.cohort is not None
    ended = reg.evaluation_finished(decision.cohort, completed(3), T0 + 5)
    assert ended and ended.records
    [drop] = [r for r in ended.records if isinstance(r, DropCohort)]
    [tomb] = [r for r in ended.records if isinstance(r, TombstoneRecord)]
    assert drop.keep_verdicts
    assert tomb.tombstone.finished_at == WALL + 5
    assert isinstance(tomb.tombstone.outcome, Completed)
    assert any(isinstance(r, WatermarkRecord) for r in ended.records)


def test_the_end_state_of_a_cohort_filled_by_its_first_member_has_one_header() -> None:
    reg, _ = registry()
    decision = reg.submit(sub(0, size=1), T0)
    assert decision.frozen
    kept = end_state(decision.records)
    assert [type(r) for r in kept] == [WatermarkRecord, CohortRecord, MemberRecord]
    header = kept[1]
    assert isinstance(header, CohortRecord) and header.phase is Phase.EVALUATING


def test_the_end_state_of_records_drops_what_a_later_record_of_the_batch_undoes() -> None:
    reg, _ = registry()
    # One batch the way a round of several registry calls makes it: a 1-member group
    # accepted (header, member), then ended (drop, tombstone), its watermark written
    # by both; then a second cohort opened under a key ended earlier in the batch.
    first = reg.submit(sub(0, gid="a", size=1), T0)
    assert first.cohort is not None
    ended = reg.evaluation_finished(first.cohort, completed(1), T0 + 1)
    assert ended
    other = reg.submit(sub(0, gid="b", size=2), T0 + 1)
    batch = [*first.records, *ended.records, *other.records]
    kept = end_state(batch)
    a_key, b_key = sub(0, gid="a").key, sub(0, gid="b").key
    assert not [r for r in kept if isinstance(r, CohortRecord | MemberRecord) and r.key == a_key]
    assert [r.key for r in kept if isinstance(r, DropCohort)] == [a_key]
    assert [r.key for r in kept if isinstance(r, CohortRecord)] == [b_key]
    marks = [r for r in kept if isinstance(r, WatermarkRecord)]
    assert sorted(m.scope for m in marks) == sorted({m.scope for m in marks})
    assert end_state(kept) == kept  # already an end state


def test_a_key_dropped_then_opened_again_in_one_batch_keeps_its_new_header() -> None:
    reg, _ = registry()
    decision = reg.submit(sub(0, size=2), T0)
    assert decision.cohort is not None
    failed = reg.fail(decision.cohort, "cancelled", T0)
    assert failed
    first_header = decision.records[1]
    assert isinstance(first_header, CohortRecord)
    header = dataclasses.replace(first_header, seq=99)
    kept = end_state([*decision.records, *failed.records, header])
    assert [r for r in kept if isinstance(r, CohortRecord)] == [header]
    assert not [r for r in kept if isinstance(r, MemberRecord)]


def _round(deferred: bool) -> tuple[list[object], list[object]]:
    """One round of events in a one-group registry: each decision's records, and what
    the round writes (deferred: taken at its end; else the end state of them all)."""
    reg, _ = registry()
    reg.wall_offset = WALL - T0
    reg.defer_records = deferred
    decisions = [reg.submit(sub(0, gid="a", size=1), T0)]
    cohort = decisions[0].cohort
    assert cohort is not None
    decisions.append(reg.evaluation_finished(cohort, completed(1), T0 + 1))  # type: ignore[arg-type]
    decisions += [reg.submit(sub(i, gid="b", size=2), T0 + 2 + i) for i in range(2)]
    decisions.append(reg.submit(sub(0, gid="c", size=3), T0 + 5))
    each = [list(d.records) for d in decisions]
    written = reg.take_records() if deferred else end_state([r for rs in each for r in rs])
    return each, written  # type: ignore[return-value]


def test_a_registry_that_defers_its_records_writes_the_end_state_of_its_round() -> None:
    """A one-group registry (the runtime's) takes a round's records at once: the
    same records as the end state of the same decisions made one by one, each decision
    carrying none, and a header made once, as its cohort is at the end of the round."""
    each, deferred = _round(True)
    _, eager = _round(False)
    assert deferred == eager
    assert all(records == [] for records in each)
    headers = [r for r in deferred if isinstance(r, CohortRecord)]
    assert [(h.key.group_id, h.phase) for h in headers] == [
        ("b", Phase.EVALUATING),
        ("c", Phase.COLLECTING),
    ]
    assert not [r for r in deferred if isinstance(r, MemberRecord) and r.key.group_id == "a"]
    reg, _ = registry()
    reg.defer_records = True
    assert reg.take_records() == []


def test_the_end_state_keeps_one_watermark_per_group_at_the_highest_attempt() -> None:
    reg, _ = registry()
    reg.submit(sub(0, attempt=1), T0)
    # Attempt 2 raises the watermark, and ending attempt 1 (superseded) raises it again
    # to 1: the end state's one watermark record keeps 2.
    decision = reg.submit(sub(0, attempt=2), T0 + 1)
    marks = [r for r in end_state(decision.records) if isinstance(r, WatermarkRecord)]
    assert [m.attempt for m in marks] == [2]
    assert [c.key.attempt for c in decision.ended] == [1]


def test_retention_drops_reach_the_durable_store_as_records() -> None:
    reg, _ = registry(max_records=1)
    for gid in ("a", "b"):
        for i in range(3):
            decision = reg.submit(sub(i, gid=gid), T0)
        assert decision.cohort is not None
        ended = reg.judge_failed(decision.cohort, "judge down", T0)
        assert ended
    # The second tombstone pushed the first out of the bound: its drop is persisted.
    assert [r.key.group_id for r in ended.records if isinstance(r, DropTombstone)] == ["a"]


def test_a_registry_restored_from_its_records_decides_as_the_original() -> None:
    """Replay every record into a Recovered, as a store would read it back."""
    reg, _ = registry(collection_s=1000)
    reg.wall_offset = WALL - T0
    records = []
    for i in range(2):
        records += reg.submit(sub(i, gid="open"), T0).records
    for i in range(3):
        decision = reg.submit(sub(i, gid="done"), T0)
        records += decision.records
    assert decision.cohort is not None
    ended = reg.judge_failed(decision.cohort, "judge down", T0 + 1)
    assert ended
    records += ended.records

    headers = {r.key: r for r in records if isinstance(r, CohortRecord)}
    dropped = {r.key for r in records if isinstance(r, DropCohort)}
    recovered = Recovered(
        cohorts=tuple(
            RecoveredCohort(
                h, tuple(m for m in records if isinstance(m, MemberRecord) and m.key == k)
            )
            for k, h in headers.items()
            if k not in dropped
        ),
        tombstones=tuple(r for r in records if isinstance(r, TombstoneRecord)),
        watermarks=tuple(r for r in records if isinstance(r, WatermarkRecord)),
    )
    # A new process, 100 s later on the wall clock, with another monotonic origin.
    again, _ = registry(collection_s=1000)
    again.wall_offset = WALL - T0 + 100 - 50
    now = T0 + 50
    [open_cohort] = again.restore(recovered, now)
    assert open_cohort.phase is Phase.COLLECTING and sorted(open_cohort.members) == [0, 1]
    # Time spent down counted: 100 s of the collection window are gone.
    assert open_cohort.collection_deadline == pytest.approx(now + 1000 - 100)
    assert again.submit(sub(0, gid="open"), now).disposition is Disposition.ATTACHED
    replay = again.submit(sub(1, gid="done"), now)
    assert replay.disposition is Disposition.REPLAYED
    assert isinstance(replay.replay, Tombstone) and isinstance(replay.replay.outcome, Masked)
    assert again.submit(sub(2, gid="open"), now).frozen


def test_a_restored_evaluating_header_enters_evaluating_through_the_table() -> None:
    """Restore takes the FILLED transition (no phase is assigned around the table): the
    frozen members and the stored evaluation deadline come back, and a member for the
    restored cohort is refused as for a cohort that filled in this process."""
    reg, _ = registry()
    reg.wall_offset = WALL - T0
    records = []
    for i in range(3):
        records += reg.submit(sub(i, gid="full"), T0).records
    header = [r for r in records if isinstance(r, CohortRecord)][-1]
    assert header.phase is Phase.EVALUATING
    members = tuple(r for r in records if isinstance(r, MemberRecord))
    again, _ = registry()
    again.wall_offset = WALL - T0
    [cohort] = again.restore(Recovered(cohorts=(RecoveredCohort(header, members),)), T0 + 1)
    assert cohort.phase is Phase.EVALUATING
    assert [m.coords.rollout_index for m in cohort.snapshot] == [0, 1, 2]
    assert cohort.evaluation_deadline == pytest.approx(T0 + EVALUATION_S)
    late = again.submit(sub(0, gid="full", text="another answer"), T0 + 2)
    assert late.rejection is not None
    with pytest.raises(IllegalTransition):
        transition(cohort.phase, Event.FILLED)  # a filled cohort cannot fill again
