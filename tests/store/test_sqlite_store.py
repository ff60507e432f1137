"""The SQLite store's own behaviour: group commit, disk failures, schema, SIGKILL.

What every backend must do is in test_store_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from genrm_grpc.cohort.model import CohortKey, Failed, MemberCoords
from genrm_grpc.cohort.records import DropTombstone, MemberRecord, WatermarkRecord
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.durable import MemoryDurable, store_from_url, validate_store_url
from genrm_grpc.store.records import StoreError, StoreSchemaError, encode_key
from genrm_grpc.store.sqlite import SCHEMA_VERSION, SqliteStore
from tests.store.samples import CTX, KEY, NOW, digest, scope_of, verdict_record


async def open_store(path: Path) -> tuple[SqliteStore, object]:
    store = SqliteStore(path)
    recovered = await store.open(NOW)
    return store, recovered


async def test_memory_store_reuses_verdicts_until_their_tombstone_goes() -> None:
    store = MemoryDurable()
    await store.open(NOW)
    await store.persist([verdict_record(KEY, 0, 1)])
    assert await store.find_verdict(scope_of(KEY), CTX, digest(0), digest(1), 0, False) is not None
    await store.persist([DropTombstone(KEY)])
    assert await store.find_verdict(scope_of(KEY), CTX, digest(0), digest(1), 0, False) is None


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


async def test_a_commit_wakes_the_event_loop_once_for_all_its_batches(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store, _ = await open_store(path)
    loop = asyncio.get_running_loop()
    wakeups: list[object] = []
    original = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any) -> Any:
        wakeups.append(callback)
        return original(callback, *args)

    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with mock.patch.object(loop, "call_soon_threadsafe", counted):
        futures = [store.persist([WatermarkRecord(f"g{n}", n, NOW + 10)]) for n in range(50)]
        await asyncio.sleep(0)
        blocker.execute("ROLLBACK")
        blocker.close()
        await asyncio.gather(*futures)
    assert store.stats.batches == 50
    assert len(wakeups) == store.stats.commits <= 2
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


async def test_a_schema_2_file_with_an_old_tombstone_record_opens_and_reads_it(
    tmp_path: Path,
) -> None:
    """Schema 3 only marks the narrower tombstone records: a file of the previous
    server, holding a version-2 record, is migrated and its tombstone reads back."""
    path = tmp_path / "s.sqlite3"
    store, _ = await open_store(path)
    await store.persist([WatermarkRecord(scope_of(KEY), 1, NOW + 60)])
    await store.close()
    old_record = marshal.dumps(
        (2, KEY.group_id, None, KEY.attempt, "", 1, "ab" * 32, NOW, bytes(32), "f", "late", False)
    )
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO tombstones VALUES (?, ?, ?)", (encode_key(KEY), old_record, NOW + 60))
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    store, recovered = await open_store(path)
    await store.close()
    [tomb] = recovered.tombstones  # type: ignore[attr-defined]
    assert tomb.tombstone.key == KEY and tomb.tombstone.prompt_digest == "ab" * 32
    assert tomb.tombstone.failed == Failed("late")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    conn.close()


async def test_a_file_that_is_not_a_database_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    path.write_bytes(b"this is not a database, just text " * 200)
    with pytest.raises(StoreSchemaError, match="unreadable"):
        await SqliteStore(path).open(NOW)


_KILLED_WRITER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from genrm_grpc.cohort.records import WatermarkRecord
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
    identity = [f for f in dataclasses.fields(CohortKey) if f.init]  # not its cached hash
    assert len(json.loads(encode_key(key))) == len(identity)
    coords = MemberCoords(2, "g", 3, 7, "p", 16)
    assert decode_coords(encode_coords(coords)) == coords
    assert len(json.loads(encode_coords(coords))) == len(dataclasses.fields(MemberCoords))
