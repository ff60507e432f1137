"""The SQLite store against a real file: round trips, group commit, failures, SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from genrm_grpc.cohort.model import (
    CohortKey,
    Completed,
    Failed,
    Masked,
    MemberCoords,
    MemberReward,
    PromptSpec,
    Tombstone,
)
from genrm_grpc.scoring.types import AnswerTexts, JudgedPair, Verdict
from genrm_grpc.store.durable import MemoryDurable, store_from_url, validate_store_url
from genrm_grpc.store.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    StoreError,
    StoreSchemaError,
    TombstoneRecord,
    VerdictRecord,
    WatermarkRecord,
)
from genrm_grpc.store.sqlite import SCHEMA_VERSION, SqliteStore

NOW = 1_800_000_000.0
PROMPT = PromptSpec((("user", "What is 2+2?"), ("assistant", "hm")), "be right", None)
KEY = CohortKey("group-a", None, 1)
LEGACY = CohortKey(None, "t7:abc", 0)
CTX = "c7" * 32


def digest(n: int) -> str:
    return f"{n:064x}"


def verdict_record(cohort: CohortKey, i: int, j: int, k: int = 0) -> VerdictRecord:
    return VerdictRecord(
        cohort=cohort,
        scope=cohort.group_id,
        context=CTX,
        first=digest(i),
        second=digest(j),
        judge_index=k,
        swap=k % 2 == 1,
        response_i=i,
        response_j=j,
        verdict=Verdict(4.0, 2.5, 2.0, parse_failed=False),
        usage=(100, 2000, 1500),
        finished_at=NOW,
    )


def completed() -> Completed:
    judged = (
        JudgedPair(0, 1, 0, Verdict(4.0, 3.0, 2.0)),
        JudgedPair(1, 0, 0, Verdict(3.0, 3.0, 3.5, parse_failed=True)),
    )
    return Completed(
        rewards=(
            MemberReward(3.75, 3.5, 3.5, 0.25, (judged[0], judged[1])),
            MemberReward(3.0, 3.0, 3.0, 0.0, (judged[0], judged[1])),
        ),
        metrics={"mean_individual_score": 3.25, "tiebreak_usage_rate": 0.5},
        judged=judged,
    )


def tombstone(key: CohortKey, outcome: Completed | Masked | Failed) -> Tombstone:
    return Tombstone(key, 2, "pd", {0: digest(1), 1: digest(2)}, outcome, finished_at=NOW)


async def open_store(path: Path) -> tuple[SqliteStore, object]:
    store = SqliteStore(path)
    recovered = await store.open(NOW)
    return store, recovered


async def test_every_record_kind_survives_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = SqliteStore(path)
    assert (await store.open(NOW)).cohorts == ()
    header = CohortRecord(KEY, 3, 2, PROMPT, "pd", "collecting", NOW, NOW + 1800)
    member = MemberRecord(
        KEY, MemberCoords(1, "group-a", 1, None, None, 2), digest(2), AnswerTexts("why", "4")
    )
    done_key = CohortKey("group-b", None, 0)
    await store.persist(
        [
            header,
            member,
            TombstoneRecord(tombstone(done_key, completed()), NOW + 3600),
            TombstoneRecord(tombstone(LEGACY, Masked("judge down", {"x": 1.0})), NOW + 3600),
            TombstoneRecord(tombstone(CohortKey("c", None, 0), Failed("late", True)), NOW + 60),
            WatermarkRecord("group-a", 1, NOW + 3600),
            verdict_record(KEY, 0, 1),
        ]
    )
    await store.close()

    again = SqliteStore(path)
    recovered = await again.open(NOW)
    try:
        assert [c.header for c in recovered.cohorts] == [header]
        assert recovered.cohorts[0].members == (member,)
        outcomes = {t.tombstone.key: t.tombstone.outcome for t in recovered.tombstones}
        assert outcomes == {
            CohortKey("c", None, 0): Failed("late", True),
            done_key: completed(),
            LEGACY: Masked("judge down", {"x": 1.0}),
        }
        kept = recovered.tombstones[1].tombstone
        assert kept.digests == {0: digest(1), 1: digest(2)}
        assert kept.prompt_digest == "pd" and kept.finished_at == NOW
        assert recovered.watermarks == (WatermarkRecord("group-a", 1, NOW + 3600),)
        assert recovered.verdicts == (verdict_record(KEY, 0, 1),)
    finally:
        await again.close()


async def test_a_hand_built_outcome_keeps_its_own_comparison_lists(tmp_path: Path) -> None:
    base = completed()
    odd = Completed(
        rewards=(
            MemberReward(1.0, 1.0, 1.0, 0.0, (base.judged[1],)),
            MemberReward(2.0, 2.0, 2.0, 0.0, ()),
        ),
        metrics={},
        judged=base.judged,
    )
    store, _ = await open_store(tmp_path / "s.sqlite3")
    await store.persist([TombstoneRecord(tombstone(KEY, odd), NOW + 10)])
    await store.close()
    again = SqliteStore(tmp_path / "s.sqlite3")
    recovered = await again.open(NOW)
    await again.close()
    assert recovered.tombstones[0].tombstone.outcome == odd


async def test_expired_tombstones_are_not_read_back(tmp_path: Path) -> None:
    store, _ = await open_store(tmp_path / "s.sqlite3")
    await store.persist(
        [
            TombstoneRecord(tombstone(CohortKey("old", None, 0), Failed("x")), NOW - 1),
            TombstoneRecord(tombstone(CohortKey("new", None, 0), Failed("x")), NOW + 1),
        ]
    )
    await store.close()
    again = SqliteStore(tmp_path / "s.sqlite3")
    recovered = await again.open(NOW)
    await again.close()
    assert [t.tombstone.key.group_id for t in recovered.tombstones] == ["new"]


async def test_watermarks_only_rise(tmp_path: Path) -> None:
    store, _ = await open_store(tmp_path / "s.sqlite3")
    await store.persist([WatermarkRecord("g", 5, NOW + 10)])
    await store.persist([WatermarkRecord("g", 3, NOW + 20)])
    await store.close()
    again = SqliteStore(tmp_path / "s.sqlite3")
    recovered = await again.open(NOW)
    await again.close()
    assert recovered.watermarks == (WatermarkRecord("g", 5, NOW + 20),)


async def test_drops_remove_records_and_the_verdicts_that_belong_to_them(tmp_path: Path) -> None:
    store, _ = await open_store(tmp_path / "s.sqlite3")
    other = CohortKey("group-b", None, 0)
    header = CohortRecord(KEY, 1, 2, PROMPT, "pd", "evaluating", NOW, NOW + 5, NOW + 60)
    await store.persist(
        [
            header,
            MemberRecord(KEY, MemberCoords(0), digest(1), AnswerTexts("", "a")),
            verdict_record(KEY, 0, 1),
            verdict_record(LEGACY, 0, 1),
            verdict_record(other, 0, 1),
            TombstoneRecord(tombstone(other, completed()), NOW + 100),
            WatermarkRecord("group-b", 0, NOW + 100),
        ]
    )
    await store.persist(
        [
            DropCohort(KEY),  # keeps its verdicts: a later attempt may reuse them
            DropCohort(LEGACY, keep_verdicts=False),
            DropTombstone(other),
            DropWatermark("group-b"),
        ]
    )
    kept = await store.find_verdict("group-a", CTX, digest(0), digest(1), 0, False)
    assert kept == verdict_record(KEY, 0, 1)
    assert await store.find_verdict("group-b", CTX, digest(0), digest(1), 0, False) is None
    await store.close()
    again = SqliteStore(tmp_path / "s.sqlite3")
    recovered = await again.open(NOW)
    try:
        assert recovered.cohorts == () and recovered.tombstones == ()
        assert recovered.watermarks == ()
        # Only active cohorts' verdicts are read at start-up; the rest stay findable.
        assert recovered.verdicts == ()
        found = await again.find_verdict("group-a", CTX, digest(0), digest(1), 0, False)
        assert found == verdict_record(KEY, 0, 1)
    finally:
        await again.close()


async def test_reuse_lookups_need_the_same_question(tmp_path: Path) -> None:
    store, _ = await open_store(tmp_path / "s.sqlite3")
    await store.persist([verdict_record(KEY, 0, 1), verdict_record(LEGACY, 0, 1)])
    try:
        assert await store.find_verdict("group-a", CTX, digest(1), digest(0), 0, False) is None
        assert await store.find_verdict("group-a", CTX, digest(0), digest(1), 0, True) is None
        assert (
            await store.find_verdict("group-a", "d8" * 32, digest(0), digest(1), 0, False) is None
        )
        # The legacy verdict (no scope) is never found by a reuse lookup.
        assert await store.find_verdict("t7:abc", CTX, digest(0), digest(1), 0, False) is None
    finally:
        await store.close()


async def test_memory_store_reuses_verdicts_until_their_tombstone_goes() -> None:
    store = MemoryDurable()
    await store.open(NOW)
    await store.persist([verdict_record(KEY, 0, 1)])
    assert await store.find_verdict("group-a", CTX, digest(0), digest(1), 0, False) is not None
    await store.persist([DropTombstone(KEY)])
    assert await store.find_verdict("group-a", CTX, digest(0), digest(1), 0, False) is None


async def test_batches_queued_during_a_commit_share_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store, _ = await open_store(path)
    # Another connection holds the write lock, so the writer thread is stuck on its
    # first batch while the other 199 queue up behind it.
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    futures = [store.persist([WatermarkRecord(f"g{n}", n, NOW + 10)]) for n in range(200)]
    await asyncio.sleep(0)
    blocker.execute("ROLLBACK")
    blocker.close()
    await asyncio.gather(*futures)
    assert store.stats.batches == 200
    assert store.stats.commits <= 2
    await store.close()


async def test_a_full_disk_fails_the_batch_and_the_store_recovers(tmp_path: Path) -> None:
    store, _ = await open_store(tmp_path / "s.sqlite3")
    conn = store._conn
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    big = MemberRecord(KEY, MemberCoords(0), digest(1), AnswerTexts("", "x" * 200_000))
    with pytest.raises(StoreError, match="could not commit"):
        await store.persist([big])
    assert store.stats.failures == 1
    conn.execute("PRAGMA max_page_count = 1073741823")
    await store.persist([big])
    await store.close()
    again = SqliteStore(tmp_path / "s.sqlite3")
    recovered = await again.open(NOW)
    await again.close()
    assert recovered.cohorts == ()  # members without a header are not a cohort


async def test_one_bad_batch_does_not_fail_its_neighbours(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store, _ = await open_store(path)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    first = store.persist([WatermarkRecord("first", 0, NOW + 10)])
    good = store.persist([WatermarkRecord("good", 1, NOW + 10)])
    # A lone surrogate cannot be encoded as UTF-8: this batch's commit fails.
    unencodable = AnswerTexts("", "\ud800")
    bad = store.persist([MemberRecord(KEY, MemberCoords(0), digest(1), unencodable)])
    await asyncio.sleep(0)
    blocker.execute("ROLLBACK")
    blocker.close()
    await first
    await good
    with pytest.raises(StoreError):
        await bad
    await store.close()


async def test_a_newer_schema_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreSchemaError, match="newer than this server"):
        await SqliteStore(path).open(NOW)


async def test_a_file_that_is_not_a_database_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"this is not a database, just text " * 200)
    with pytest.raises(StoreSchemaError, match="unreadable"):
        await SqliteStore(path).open(NOW)


async def test_persisting_to_a_closed_store_fails(tmp_path: Path) -> None:
    store, _ = await open_store(tmp_path / "s.sqlite3")
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.persist([WatermarkRecord("g", 1, NOW)])


_KILLED_WRITER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from genrm_grpc.store.records import WatermarkRecord
    from genrm_grpc.store.sqlite import SqliteStore

    async def main():
        store = SqliteStore(sys.argv[1])
        await store.open(0.0)
        await asyncio.gather(
            *[store.persist([WatermarkRecord(f"g{n}", n, 9e9)]) for n in range(500)]
        )
        print("durable", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def test_what_persist_confirmed_survives_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.strip() == "durable"

    async def reopen() -> int:
        store = SqliteStore(path)
        recovered = await store.open(NOW)
        await store.close()
        return len(recovered.watermarks)

    assert asyncio.run(reopen()) == 500


def test_store_urls() -> None:
    assert isinstance(store_from_url("memory://"), MemoryDurable)
    rel = store_from_url("sqlite:///genrm-state.sqlite3")
    assert isinstance(rel, SqliteStore) and str(rel.path) == "genrm-state.sqlite3"
    absolute = store_from_url("sqlite:////var/lib/genrm/state.sqlite3")
    assert isinstance(absolute, SqliteStore)
    assert str(absolute.path) == "/var/lib/genrm/state.sqlite3"
    for bad in ("redis-ish://x", "sqlite://host/x", "sqlite:///", "memory://x", "state.db"):
        with pytest.raises(ValueError):
            validate_store_url(bad)


def test_keys_and_coordinates_encode_every_field_and_decode_to_the_same_value() -> None:
    """The encoders name the fields by hand (for speed): a field added to CohortKey or
    MemberCoords and not encoded would be lost across a restart."""
    import dataclasses

    from genrm_grpc.store.records import decode_coords, decode_key, encode_coords, encode_key

    key = CohortKey("g", "legacy", 3, "alice")
    assert decode_key(encode_key(key)) == key
    assert len(json.loads(encode_key(key))) == len(dataclasses.fields(CohortKey))
    coords = MemberCoords(2, "g", 3, 7, "p", 16)
    assert decode_coords(encode_coords(coords)) == coords
    assert len(json.loads(encode_coords(coords))) == len(dataclasses.fields(MemberCoords))
