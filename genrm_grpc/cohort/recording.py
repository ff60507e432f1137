"""Which records a cohort becomes (header, members, tombstone, the records that end it),
and a cohort rebuilt from them; the record types themselves are ``cohort/records.py``'s.

Record times are wall-clock, a registry's are ``now``-based: ``offset`` is the
registry's ``wall_offset`` (wall minus ``now``). ``genrm_grpc.cohort.registry`` decides
when a record is written; these functions say what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Member,
    Outcome,
    Tombstone,
)
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    MemberRecord,
    Record,
    RecoveredCohort,
    WatermarkRecord,
)


def cohort_record(cohort: Cohort, offset: float) -> CohortRecord:
    """The cohort's header: identity, prompt, phase and deadlines (wall-clock)."""
    deadline = cohort.evaluation_deadline
    return CohortRecord(
        key=cohort.key,
        seq=cohort.seq,
        group_size=cohort.group_size,
        prompt=cohort.prompt,
        prompt_digest=cohort.prompt_digest,
        phase=cohort.phase,
        created_at=cohort.created_at + offset,
        collection_deadline=cohort.collection_deadline + offset,
        evaluation_deadline=None if deadline is None else deadline + offset,
        follows_attempt=cohort.follows_attempt,
    )


def member_record(key: CohortKey, member: Member) -> MemberRecord:
    return MemberRecord(key, member.coords, member.candidate.digest, member.candidate.texts)


def restored_cohort(entry: RecoveredCohort, offset: float) -> Cohort:
    """The active cohort a store held at start-up, collecting, its instants ``now``-based
    again (the registry fills it when its header says it was filled before)."""
    head = entry.header
    members = {
        m.coords.rollout_index: Member(m.coords, CandidateSpec(m.texts, m.digest))
        for m in entry.members
    }
    return Cohort(
        key=head.key,
        seq=head.seq,
        group_size=head.group_size,
        prompt=head.prompt,
        prompt_digest=head.prompt_digest,
        created_at=head.created_at - offset,
        collection_deadline=head.collection_deadline - offset,
        members=members,
        follows_attempt=head.follows_attempt,
    )


def tombstone_of(
    cohort: Cohort, digests: Mapping[int, str], outcome: Outcome, finished_at: float
) -> Tombstone:
    """What the ended ``cohort`` leaves behind (``finished_at`` wall-clock)."""
    return Tombstone(
        key=cohort.key,
        group_size=cohort.group_size,
        prompt_digest=cohort.prompt_digest,
        digests=digests,
        outcome=outcome,
        finished_at=finished_at,
    )


#: What a registry that defers its records writes: a cohort stands for its header,
#: which :func:`end_state` makes.
Deferred = Record | Cohort


def end_state(entries: Sequence[Deferred], offset: float = 0.0) -> list[Record]:
    """``entries`` as a store needs them: their end state, in order.

    A store applies records in order and keeps only their result, so what a later
    record of the same batch undoes is not written: a header replaces an earlier one of
    the same cohort (in its place), a drop takes back the cohort's header and members
    written before it in the batch (a 1-member group created, scored and ended in one
    decision writes no header or member), and one watermark per group stays, at the
    highest attempt any of them named. A drop itself always stays: the store may hold
    the cohort from an earlier batch.

    A ``Cohort`` among ``entries`` stands for its header, made here (``offset`` as in
    :func:`cohort_record`) from the cohort as it is now: a registry that defers its
    records (``CohortRegistry.defer_records``) never makes a header a later entry of
    the batch undoes.
    """
    if len(entries) == 1 and not isinstance(entries[0], Cohort):
        return [entries[0]]
    out: list[Deferred | None] = []
    bodies: dict[CohortKey, list[int]] = {}
    headers: dict[CohortKey, int] = {}
    marks: dict[str, int] = {}
    for record in entries:
        kind = type(record)  # the record types are final: no subclass to miss
        if kind is MemberRecord:
            bodies.setdefault(record.key, []).append(len(out))  # type: ignore[union-attr]
        elif kind is CohortRecord or kind is Cohort:
            key = record.key  # type: ignore[union-attr]
            at = headers.get(key)
            if at is not None:
                out[at] = record
                continue
            headers[key] = len(out)
            bodies.setdefault(key, []).append(len(out))
        elif kind is DropCohort:
            assert isinstance(record, DropCohort)
            for at in bodies.pop(record.key, ()):
                out[at] = None
            headers.pop(record.key, None)
        elif kind is WatermarkRecord:
            assert isinstance(record, WatermarkRecord)
            at = marks.get(record.scope)
            if at is not None:
                earlier = out[at]
                out[at] = None
                if isinstance(earlier, WatermarkRecord) and earlier.attempt > record.attempt:
                    record = WatermarkRecord(record.scope, earlier.attempt, record.expires_at)
            marks[record.scope] = len(out)
        out.append(record)
    return [
        cohort_record(entry, offset) if isinstance(entry, Cohort) else entry
        for entry in out
        if entry is not None
    ]
