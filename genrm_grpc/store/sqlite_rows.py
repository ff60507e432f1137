"""The SQLite store's rows: what one commit writes, and what start-up reads back.

A commit writes the *end state* of its records, not one statement per record
(:class:`EndState`): a row written several times in one commit (a cohort's header at
each phase, a member resubmitted) is written once, with its last value, and a row that
a later record of the same commit deletes is not written at all. What is left goes as
one ``executemany`` per statement: every delete first, then every insert. That order is
the per-record order's result, because each row's end state is decided by its last
record: a row whose last record deletes it has no insert left, and a row whose last
record writes it is written after the deletes. A watermark is raised, never lowered:
the inserts of one scope since its last delete fold into one (the highest attempt,
the last expiry), which the upsert then raises against the stored row, if any.

The store also knows which cohorts may have rows in the file (read at start-up, added
to before each commit, taken out once a drop is committed): a cohort that begins and
ends within one commit, as a 1-member cohort does, is never written and never deleted.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from genrm_grpc.cohort.model import CohortKey, Phase, Tombstone
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    Record,
    Recovered,
    RecoveredCohort,
    TombstoneRecord,
    VerdictRecord,
    WatermarkRecord,
)
from genrm_grpc.scoring.types import AnswerTexts, Verdict
from genrm_grpc.store.records import (
    decode_coords,
    decode_key,
    decode_prompt,
    encode_coords,
    encode_key,
    encode_prompt,
)

_INSERT_COHORT = "INSERT OR REPLACE INTO cohorts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_MEMBER = "INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?, ?, ?)"
_INSERT_TOMBSTONE = "INSERT OR REPLACE INTO tombstones VALUES (?, ?, ?)"
_INSERT_VERDICT = (
    "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_RAISE_WATERMARK = (
    "INSERT INTO watermarks VALUES (?, ?, ?) ON CONFLICT (scope) DO UPDATE SET "
    "attempt = max(attempt, excluded.attempt), expires_at = excluded.expires_at"
)

VERDICT_COLUMNS = (
    "scope, context, first, second, judge_index, swap, response_i, response_j, score_1, "
    "score_2, ranking, parse_failed, input_tokens, output_tokens, reasoning_tokens, finished_at"
)


class EndState:
    """The rows a run of records leaves, keyed as the tables are; :meth:`write` it.

    Each dict keeps its rows in the order in which the per-record path would have
    given them rowids: a row replaced (``INSERT OR REPLACE``) moves to the end, a
    watermark raised (an upsert, which updates its row in place) keeps its place. The
    dicts hold the records; only those left at :meth:`write` are encoded.
    """

    def __init__(self) -> None:
        self.cohorts: dict[str, CohortRecord] = {}
        self.members: dict[str, dict[int, MemberRecord]] = {}
        self.verdicts: dict[str, dict[tuple[int, int, int], VerdictRecord]] = {}
        self.tombstones: dict[str, TombstoneRecord] = {}
        self.watermarks: dict[str, list[Any]] = {}
        # Deletes: cohorts with their members; verdicts by cohort; tombstones; watermarks.
        self.dropped_cohorts: set[str] = set()
        self.dropped_verdicts: set[str] = set()
        self.dropped_tombstones: set[str] = set()
        self.dropped_watermarks: set[str] = set()
        self._keys: dict[int, tuple[CohortKey, str]] = {}

    def _key(self, key: CohortKey) -> str:
        # Records of one cohort share its key object: encode it once per commit. The
        # key object is kept with its text, so its id cannot be reused meanwhile.
        hit = self._keys.get(id(key))
        if hit is None or hit[0] is not key:
            hit = self._keys[id(key)] = (key, encode_key(key))
        return hit[1]

    def add_all(self, records: Sequence[Record]) -> None:
        for record in records:
            self.add(record)

    def add(self, record: Record) -> None:
        """Fold ``record`` in, as if applied after everything added before it."""
        if isinstance(record, MemberRecord):
            rows = self.members.setdefault(self._key(record.key), {})
            slot = record.coords.rollout_index
            rows.pop(slot, None)
            rows[slot] = record
        elif isinstance(record, VerdictRecord):
            passes = self.verdicts.setdefault(self._key(record.cohort), {})
            at = (record.response_i, record.response_j, record.judge_index)
            passes.pop(at, None)
            passes[at] = record
        elif isinstance(record, CohortRecord):
            key = self._key(record.key)
            self.cohorts.pop(key, None)
            self.cohorts[key] = record
        elif isinstance(record, TombstoneRecord):
            key = self._key(record.tombstone.key)
            self.tombstones.pop(key, None)
            self.tombstones[key] = record
        elif isinstance(record, WatermarkRecord):
            # Raised in place (an upsert keeps its row): the first write keeps its place.
            mark = self.watermarks.get(record.scope)
            if mark is None:
                self.watermarks[record.scope] = [record.scope, record.attempt, record.expires_at]
            else:
                mark[1], mark[2] = max(mark[1], record.attempt), record.expires_at
        else:
            self._drop(record)

    def _drop(self, record: Record) -> None:
        if isinstance(record, DropCohort):
            key = self._key(record.key)
            self.cohorts.pop(key, None)
            self.members.pop(key, None)
            self.dropped_cohorts.add(key)
            if not record.keep_verdicts:
                self.verdicts.pop(key, None)
                self.dropped_verdicts.add(key)
        elif isinstance(record, DropTombstone):
            key = self._key(record.key)
            self.tombstones.pop(key, None)
            self.verdicts.pop(key, None)
            self.dropped_tombstones.add(key)
            self.dropped_verdicts.add(key)
        elif isinstance(record, DropWatermark):
            self.watermarks.pop(record.scope, None)
            self.dropped_watermarks.add(record.scope)
        else:  # pragma: no cover - the Record union is closed
            raise TypeError(f"not a store record: {record!r}")

    def write(self, conn: sqlite3.Connection, stored: set[str]) -> None:
        """Every delete, then every insert, one ``executemany`` per statement.

        ``stored`` holds every cohort key that may have a header or member rows in the
        file (a superset: :meth:`settle` takes keys out once their drop is committed).
        A dropped cohort outside it has no row to delete, e.g. a 1-member cohort whose
        header, member and drop all came in this commit: its deletes are skipped.
        """
        gone = self.dropped_cohorts & stored
        stored.update(self.cohorts, self.members)  # before the commit: kept if it fails
        deletes = (
            ("DELETE FROM cohorts WHERE key = ?", gone),
            ("DELETE FROM members WHERE key = ?", gone),
            ("DELETE FROM verdicts WHERE cohort = ?", self.dropped_verdicts),
            ("DELETE FROM tombstones WHERE key = ?", self.dropped_tombstones),
            ("DELETE FROM watermarks WHERE scope = ?", self.dropped_watermarks),
        )
        for sql, keys in deletes:
            if keys:
                conn.executemany(sql, [(k,) for k in keys])
        inserts: tuple[tuple[str, Any], ...] = (
            (_INSERT_COHORT, [_cohort_row(k, r) for k, r in self.cohorts.items()]),
            (
                _INSERT_MEMBER,
                [_member_row(k, r) for k, rows in self.members.items() for r in rows.values()],
            ),
            (
                _INSERT_TOMBSTONE,
                [(k, r.tombstone.record(), r.expires_at) for k, r in self.tombstones.items()],
            ),
            (_RAISE_WATERMARK, self.watermarks.values()),
            (
                _INSERT_VERDICT,
                [_verdict_row(k, r) for k, rows in self.verdicts.items() for r in rows.values()],
            ),
        )
        for sql, rows in inserts:
            if rows:
                conn.executemany(sql, rows)

    def settle(self, stored: set[str]) -> None:
        """After the commit: the dropped cohorts not written again have no rows left."""
        stored.difference_update(self.dropped_cohorts - self.cohorts.keys() - self.members.keys())


def _cohort_row(key: str, record: CohortRecord) -> tuple[Any, ...]:
    return (
        key,
        record.key.group_id,
        record.seq,
        record.group_size,
        encode_prompt(record.prompt),
        record.prompt_digest,
        record.phase.value,
        record.created_at,
        record.collection_deadline,
        record.evaluation_deadline,
        record.follows_attempt,
    )


def _member_row(key: str, record: MemberRecord) -> tuple[Any, ...]:
    return (
        key,
        record.coords.rollout_index,
        encode_coords(record.coords),
        record.digest,
        record.texts.reasoning,
        record.texts.answer,
    )


def _verdict_row(key: str, record: VerdictRecord) -> tuple[Any, ...]:
    v, usage = record.verdict, record.usage or (None, None, None)
    return (
        key,
        record.response_i,
        record.response_j,
        record.judge_index,
        record.scope,
        bytes.fromhex(record.context),
        bytes.fromhex(record.first),
        bytes.fromhex(record.second),
        record.swap,
        v.score_1,
        v.score_2,
        v.ranking,
        v.parse_failed,
        *usage,
        record.finished_at,
    )


# ---------------------------------------------------------------------- reading back
def verdict(cohort: CohortKey, row: Sequence[Any]) -> VerdictRecord:
    """A verdicts row (``VERDICT_COLUMNS``) as the record it was written from."""
    (scope, context, first, second, k, swap, i, j, s1, s2, rank, failed, *usage, finished) = row
    return VerdictRecord(
        cohort=cohort,
        scope=scope,
        context=context.hex(),
        first=first.hex(),
        second=second.hex(),
        judge_index=k,
        swap=bool(swap),
        response_i=i,
        response_j=j,
        verdict=Verdict(s1, s2, rank, bool(failed)),
        usage=None if usage[0] is None else (usage[0], usage[1], usage[2]),
        finished_at=finished,
    )


def stored_cohorts(conn: sqlite3.Connection) -> set[str]:
    """The cohort keys with a header or member rows in the file (``EndState.write``)."""
    return {key for (key,) in conn.execute("SELECT key FROM cohorts UNION SELECT key FROM members")}


def load(conn: sqlite3.Connection, now_wall: float) -> Recovered:
    """Everything the file holds that a restart needs (tombstones not yet expired)."""
    tombstones = tuple(
        TombstoneRecord(Tombstone.from_record(blob), expires)
        for blob, expires in conn.execute(
            "SELECT record, expires_at FROM tombstones WHERE expires_at > ? ORDER BY expires_at",
            (now_wall,),
        )
    )
    watermarks = tuple(
        WatermarkRecord(scope, attempt, expires)
        for scope, attempt, expires in conn.execute(
            "SELECT scope, attempt, expires_at FROM watermarks ORDER BY expires_at"
        )
    )
    return Recovered(_load_cohorts(conn), tombstones, watermarks, _load_verdicts(conn))


def _load_members(conn: sqlite3.Connection) -> dict[str, list[MemberRecord]]:
    members: dict[str, list[MemberRecord]] = {}
    for key, _slot, coords, digest, reasoning, answer in conn.execute(
        "SELECT key, slot, coords, digest, reasoning, answer FROM members ORDER BY key, slot"
    ):
        members.setdefault(key, []).append(
            MemberRecord(
                decode_key(key), decode_coords(coords), digest, AnswerTexts(reasoning, answer)
            )
        )
    return members


def _load_cohorts(conn: sqlite3.Connection) -> tuple[RecoveredCohort, ...]:
    members = _load_members(conn)
    cohorts = []
    for (
        key,
        seq,
        size,
        prompt,
        digest,
        phase,
        created,
        collection,
        evaluation,
        follows,
    ) in conn.execute(
        "SELECT key, seq, group_size, prompt, prompt_digest, phase, created_at, "
        "collection_deadline, evaluation_deadline, follows_attempt FROM cohorts ORDER BY seq"
    ):
        header = CohortRecord(
            key=decode_key(key),
            seq=seq,
            group_size=size,
            prompt=decode_prompt(prompt),
            prompt_digest=digest,
            phase=Phase(phase),
            created_at=created,
            collection_deadline=collection,
            evaluation_deadline=evaluation,
            follows_attempt=bool(follows),
        )
        cohorts.append(RecoveredCohort(header, tuple(members.get(key, ()))))
    return tuple(cohorts)


def _load_verdicts(conn: sqlite3.Connection) -> tuple[VerdictRecord, ...]:
    # Verdicts of active cohorts only: they are what a resumed evaluation skips. Those
    # of terminal cohorts stay on disk for reuse lookups (find_verdict).
    keys: dict[str, CohortKey] = {}
    return tuple(
        verdict(keys.get(row[0]) or keys.setdefault(row[0], decode_key(row[0])), row[1:])
        for row in conn.execute(
            f"SELECT cohort, {VERDICT_COLUMNS} FROM verdicts "
            "WHERE cohort IN (SELECT key FROM cohorts)"
        )
    )
