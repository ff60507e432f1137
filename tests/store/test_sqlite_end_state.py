"""A SQLite commit writes the end state of its records, not one statement per record.

Every test compares with the per-record path: the same records persisted one by one,
each in a commit of its own, where nothing can be coalesced. The tables (rows in rowid
order where a table has rowids) and what a reopen recovers must be the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_grpc.cohort.model import CohortKey, Failed, Masked, MemberCoords, Phase
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    Record,
    Recovered,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.records import StoreError, encode_key
from genrm_grpc.store.sqlite import SqliteStore
from genrm_grpc.store.sqlite_rows import EndState
from tests.store.samples import NOW, PROMPT, digest, tombstone, verdict_record

KEYS = (CohortKey("g1", None, 1), CohortKey("g1", None, 2), CohortKey(None, "t7:abc", 0))
SCOPES = ("g1", "g2")
TABLES = {
    "cohorts": "ORDER BY rowid",
    "members": "ORDER BY key, slot",
    "tombstones": "ORDER BY rowid",
    "watermarks": "ORDER BY rowid",
    "verdicts": "ORDER BY cohort, response_i, response_j, judge_index",
}


def header(key: CohortKey, phase: Phase = Phase.COLLECTING, seq: int = 1) -> CohortRecord:
    deadline = None if phase is Phase.COLLECTING else NOW + 60
    return CohortRecord(key, seq, 4, PROMPT, "pd", phase, NOW, NOW + 30, deadline)


def member(key: CohortKey, slot: int, answer: str = "a") -> MemberRecord:
    return MemberRecord(key, MemberCoords(slot), digest(slot), AnswerTexts("r", answer))


def dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(path) as conn:
        return {
            t: conn.execute(f"SELECT * FROM {t} {order}").fetchall() for t, order in TABLES.items()
        }


async def written(path: Path, commits: Sequence[Sequence[Record]]) -> Recovered:
    """Persist each of ``commits`` as one batch, awaiting each; what a reopen recovers."""
    store = SqliteStore(path)
    await store.open(NOW)
    for records in commits:
        await store.persist(records)
    assert store.stats.commits == sum(1 for records in commits if records)
    await store.close()
    again = SqliteStore(path)
    recovered = await again.open(NOW)
    await again.close()
    return recovered


async def assert_as_one_by_one(tmp_path: Path, records: Sequence[Record]) -> None:
    one_by_one = await written(tmp_path / "each.sqlite3", [[r] for r in records])
    together = await written(tmp_path / "all.sqlite3", [records])
    assert dump(tmp_path / "all.sqlite3") == dump(tmp_path / "each.sqlite3")
    assert together == one_by_one


async def test_a_header_rewritten_and_a_cohort_dropped_after_its_insert_restore_as_one_by_one(
    tmp_path: Path,
) -> None:
    a, b, _ = KEYS
    records: list[Record] = [
        header(a),
        member(a, 0),
        member(a, 1, "first"),
        header(a, Phase.EVALUATING),
        member(a, 1, "second"),  # supersedes slot 1
        header(b),
        member(b, 0),
        DropCohort(b),  # inserted above, dropped in the same commit: nothing of b stays
        header(a, Phase.EVALUATING, seq=7),  # the last header wins
    ]
    await assert_as_one_by_one(tmp_path, records)
    recovered = await written(tmp_path / "check.sqlite3", [records])
    (only,) = recovered.cohorts
    assert only.header == header(a, Phase.EVALUATING, seq=7)
    assert [m.texts.answer for m in only.members] == ["a", "second"]


async def test_rows_written_after_a_drop_in_the_same_commit_stay(tmp_path: Path) -> None:
    a, _, legacy = KEYS
    before = [header(a), member(a, 0), verdict_record(a, 0, 1)]
    records: list[Record] = [
        DropCohort(a, keep_verdicts=False),
        header(a),
        member(a, 2),
        verdict_record(a, 1, 2),
        TombstoneRecord(tombstone(legacy, Failed("late")), NOW + 10),
        DropTombstone(legacy),
        TombstoneRecord(tombstone(legacy, Masked("judge down")), NOW + 20),
    ]
    await assert_as_one_by_one(tmp_path, before + records)
    recovered = await written(tmp_path / "check.sqlite3", [before, records])
    (cohort,) = recovered.cohorts
    assert [m.coords.rollout_index for m in cohort.members] == [2]  # the drop took slot 0
    assert [(v.response_i, v.response_j) for v in recovered.verdicts] == [(1, 2)]
    (tomb,) = recovered.tombstones
    assert tomb.expires_at == NOW + 20


async def test_a_drop_after_an_insert_in_the_same_commit_still_deletes_the_stored_row(
    tmp_path: Path,
) -> None:
    a, _, legacy = KEYS
    stored = [
        header(a),
        member(a, 0),
        verdict_record(legacy, 0, 1),
        TombstoneRecord(tombstone(legacy, Failed("x")), NOW + 10),
        WatermarkRecord("g1", 3, NOW + 10),
    ]
    records: list[Record] = [
        member(a, 1),
        DropCohort(a),
        verdict_record(legacy, 1, 0),
        DropTombstone(legacy),
        WatermarkRecord("g1", 5, NOW + 20),
        DropWatermark("g1"),
    ]
    await assert_as_one_by_one(tmp_path, stored + records)
    recovered = await written(tmp_path / "check.sqlite3", [stored, records])
    assert recovered == Recovered()
    with sqlite3.connect(tmp_path / "check.sqlite3") as conn:
        assert conn.execute("SELECT count(*) FROM verdicts").fetchone() == (0,)


async def test_a_row_rewritten_in_a_commit_takes_the_place_of_its_last_write(
    tmp_path: Path,
) -> None:
    # Tombstones of equal expiry come back in the order they were last written.
    a, b, _ = KEYS
    first, second = (TombstoneRecord(tombstone(k, Failed("x")), NOW + 10) for k in (a, b))
    again = TombstoneRecord(tombstone(a, Masked("again")), NOW + 10)
    await assert_as_one_by_one(tmp_path, [header(a), header(b), first, second, header(a), again])
    recovered = await written(tmp_path / "check.sqlite3", [[first, second, again]])
    assert [t.tombstone.key for t in recovered.tombstones] == [b, a]


async def test_watermarks_of_one_commit_keep_the_highest_attempt_and_the_last_expiry(
    tmp_path: Path,
) -> None:
    stored = [WatermarkRecord("g1", 9, NOW + 5), WatermarkRecord("g2", 9, NOW + 5)]
    records: list[Record] = [
        WatermarkRecord("g1", 4, NOW + 30),
        WatermarkRecord("g1", 2, NOW + 40),  # lower: the attempt stays, the expiry moves
        DropWatermark("g2"),
        WatermarkRecord("g2", 3, NOW + 50),  # after its drop: the stored 9 is gone
        WatermarkRecord("g2", 1, NOW + 60),
        # New in this commit: a raise updates the row in place, g3 stays before g4.
        WatermarkRecord("g3", 1, NOW + 70),
        WatermarkRecord("g4", 1, NOW + 70),
        WatermarkRecord("g3", 2, NOW + 70),
    ]
    await assert_as_one_by_one(tmp_path, stored + records)
    recovered = await written(tmp_path / "check.sqlite3", [stored, records])
    assert recovered.watermarks == (
        WatermarkRecord("g1", 9, NOW + 40),
        WatermarkRecord("g2", 3, NOW + 60),
        WatermarkRecord("g3", 2, NOW + 70),
        WatermarkRecord("g4", 1, NOW + 70),
    )


def traced_write(path: Path, records: Sequence[Record], stored: set[str]) -> list[str]:
    """The statements one commit of ``records`` executes (one per row, executemany too)."""
    rows = EndState()
    rows.add_all(records)
    statements: list[str] = []
    with sqlite3.connect(path) as conn:
        conn.set_trace_callback(statements.append)
        rows.write(conn, stored)
    return statements


async def test_a_row_written_several_times_in_a_commit_is_written_once(tmp_path: Path) -> None:
    await written(tmp_path / "s.sqlite3", [])  # the schema
    a, b, _ = KEYS
    records = [
        header(a),
        member(a, 0),
        header(a, Phase.EVALUATING),
        member(a, 0, "again"),
        verdict_record(a, 0, 1),
        verdict_record(a, 0, 1),
        WatermarkRecord("g1", 1, NOW),
        WatermarkRecord("g1", 2, NOW),
        header(b),
        DropCohort(b),
    ]
    statements = traced_write(tmp_path / "s.sqlite3", records, set())
    writes = [s.split(" (")[0].split(" VALUES")[0] for s in statements if "INTO" in s]
    assert sorted(writes) == sorted(
        [
            "INSERT OR REPLACE INTO cohorts",
            "INSERT OR REPLACE INTO members",
            "INSERT OR REPLACE INTO verdicts",
            "INSERT INTO watermarks",
        ]
    )
    # b was never in the file: nothing to delete. Once it may be, its drop deletes.
    assert not [s for s in statements if s.startswith("DELETE")]
    stored = {encode_key(b)}
    statements = traced_write(tmp_path / "s.sqlite3", records, stored)
    assert sum(s.startswith("DELETE") for s in statements) == 2  # b's header and members
    assert stored == {encode_key(a), encode_key(b)}  # a is written: it may be in the file


async def test_a_drop_deletes_the_rows_an_earlier_process_left_in_the_file(
    tmp_path: Path,
) -> None:
    a, b, _ = KEYS
    path = tmp_path / "s.sqlite3"
    # b's member is in the file without its header (a write that failed half-way).
    await written(path, [[header(a), member(a, 0), member(b, 1)]])
    recovered = await written(path, [[DropCohort(a), DropCohort(b)]])
    assert recovered == Recovered()
    assert dump(path)["members"] == []


async def test_a_cohort_dropped_after_a_failed_commit_leaves_no_rows(tmp_path: Path) -> None:
    # The failed commit (rolled back) held the cohort's header; the store's record of
    # which cohorts may have rows must still lead the later drop to delete them.
    a = KEYS[0]
    path = tmp_path / "s.sqlite3"
    store = SqliteStore(path)
    await store.open(NOW)
    unencodable = MemberRecord(a, MemberCoords(1), digest(1), AnswerTexts("", "\ud800"))
    with pytest.raises(StoreError):
        await store.persist([header(a), unencodable])
    await store.persist([header(a), member(a, 0)])
    await store.persist([DropCohort(a)])
    await store.close()
    assert dump(path)["cohorts"] == dump(path)["members"] == []


def records_strategy() -> st.SearchStrategy[list[Record]]:
    key = st.sampled_from(KEYS)
    scope = st.sampled_from(SCOPES)
    slot = st.integers(0, 2)
    one = st.one_of(
        st.builds(
            header, key, st.sampled_from([Phase.COLLECTING, Phase.EVALUATING]), st.integers(0, 3)
        ),
        st.builds(member, key, slot, st.sampled_from(["x", "y"])),
        st.builds(DropCohort, key, st.booleans()),
        st.builds(verdict_record, key, slot, slot, st.integers(0, 1)),
        st.builds(
            lambda k, e: TombstoneRecord(tombstone(k, Failed("f")), NOW + e), key, st.integers(1, 3)
        ),
        st.builds(DropTombstone, key),
        st.builds(WatermarkRecord, scope, st.integers(0, 5), st.integers(1, 4).map(NOW.__add__)),
        st.builds(DropWatermark, scope),
    )
    return st.lists(one, max_size=24)


@settings(max_examples=100, deadline=None)
@given(commits=st.lists(records_strategy(), min_size=1, max_size=4))
def test_any_commits_leave_what_their_records_applied_one_by_one_leave(
    commits: list[list[Record]],
) -> None:
    async def both(path: Path) -> None:
        each = await written(path / "each.sqlite3", [[r] for c in commits for r in c])
        together = await written(path / "all.sqlite3", commits)
        assert dump(path / "all.sqlite3") == dump(path / "each.sqlite3")
        assert together == each

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(both(Path(tmp)))


async def test_members_written_after_their_cohorts_drop_are_deleted_by_a_later_drop(
    tmp_path: Path,
) -> None:
    a = KEYS[0]
    first: list[list[Record]] = [[header(a), member(a, 0)], [DropCohort(a), member(a, 1)]]
    await written(tmp_path / "kept.sqlite3", first)
    assert [row[1] for row in dump(tmp_path / "kept.sqlite3")["members"]] == [1]
    # The same three commits on one open store: the last drop deletes that row.
    await written(tmp_path / "s.sqlite3", [*first, [DropCohort(a)]])
    assert dump(tmp_path / "s.sqlite3")["members"] == []


async def test_the_row_of_a_pass_written_twice_in_a_commit_is_the_last_one(
    tmp_path: Path,
) -> None:
    a = KEYS[0]
    first = verdict_record(a, 0, 1)
    again = dataclasses.replace(first, finished_at=NOW + 1)
    store = SqliteStore(tmp_path / "s.sqlite3")
    await store.open(NOW)
    await store.persist([first, again])
    assert store.stats.commits == 1
    found = await store.find_verdict(
        again.scope or "", again.context, again.first, again.second, 0, False
    )
    await store.close()
    assert found == again
