"""The in-process group store with a real SQLite file behind it.

What the file must hold is read back by a second ``LocalGroups`` on the same file (a
restart); the one interleaving that matters (a read while a commit is being written) is
held for real with SQLite's write lock from a second connection. Last, the bound on
what the store keeps in memory for waiters (the outcome mailboxes).
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from genrm_grpc.cohort.model import Failed, Tombstone
from genrm_grpc.cohort.records import (
    DropTombstone,
    DropWatermark,
    Record,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.cohort.registry import CohortRegistry
from genrm_grpc.config import Settings
from genrm_grpc.store.group_state import GroupState
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.local_state import Held, Index
from genrm_grpc.store.sqlite import SqliteStore
from genrm_grpc.testing import ManualClock
from tests.cohort.support import sub
from tests.store.samples import decide_on

SETTINGS = Settings(store="memory://", cohort_collection_timeout_s=60.0, max_terminal_cohorts=2)


def _decide(state: GroupState) -> tuple[CohortRegistry, float]:
    return decide_on(state, SETTINGS)


async def _opened(path: Path) -> LocalGroups:
    groups = LocalGroups(SETTINGS, lease_s=10, behind=SqliteStore(path))
    await groups.connect()
    return groups


async def _end_one(groups: LocalGroups, gid: str) -> Tombstone:
    """Open a cohort through ``groups`` and fail it, telling the commit what ended."""
    key = sub(0, gid=gid).key
    state = await groups.load(key)
    registry, now = _decide(state)
    assert (await groups.commit(state, registry.submit(sub(0, gid=gid), now).records)).written
    state = await groups.load(key)
    registry, now = _decide(state)
    cohort = registry.active(key)
    assert cohort is not None
    ended = registry.fail(cohort, "stopped by a test", now)
    assert ended
    [tomb] = [r.tombstone for r in ended.records if isinstance(r, TombstoneRecord)]
    assert (await groups.commit(state, ended.records, ended=[tomb])).written
    return tomb


async def test_what_retention_drops_past_its_bound_is_dropped_from_the_file_too(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite3"
    groups = await _opened(path)
    await _end_one(groups, "kept-open")
    key = sub(0, gid="kept-open").key
    state = await groups.load(key)
    registry, now = _decide(state)
    # One cohort stays active, three end: max_terminal_cohorts=2 keeps the newest two.
    assert (await groups.commit(state, registry.submit(sub(0, gid="open"), now).records)).written
    for gid in ("a", "b", "c"):
        await _end_one(groups, gid)
    assert (await groups.census(time.time()))[2] == 2
    await groups.store.close()

    again = await _opened(path)  # a restart on the same file
    active, _, tombstones, _ = await again.census(time.time())
    assert (active, tombstones) == (1, 2)
    assert set(await again.outcomes([sub(0, gid=g).key for g in ("a", "b", "c")])) == {
        sub(0, gid="b").key,
        sub(0, gid="c").key,
    }
    await again.store.close()


async def test_a_read_waits_for_the_commit_being_written_and_sees_it(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    groups = await _opened(path)
    key = sub(0).key
    state = await groups.load(key)
    registry, now = _decide(state)
    records = registry.submit(sub(0), now).records
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the writer waits for this connection
        commit = asyncio.ensure_future(groups.commit(state, records))
        for _ in range(1000):  # loop turns until the commit reaches the writer
            group = groups.state.groups.get(key.group_scope or "")
            if group is not None and group.pending is not None:
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError("the commit never reached the file")
        read = asyncio.ensure_future(groups.load(key))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not read.done()  # nothing of the commit is held, and the read waits
        lock.execute("ROLLBACK")
    finally:
        lock.close()
    assert (await asyncio.wait_for(commit, 10)).written
    seen = await asyncio.wait_for(read, 10)
    assert seen.version != state.version
    assert [c.header.key for c in seen.recovered.cohorts] == [key]
    await groups.store.close()


def test_outcome_mailboxes_are_bounded_by_max_terminal_cohorts_oldest_first() -> None:
    """A busy process ends far more cohorts within the mailbox TTL than it keeps
    tombstones; the mailboxes keep no more than ``max_terminal_cohorts`` either."""
    held = Held(SETTINGS, ManualClock())  # max_terminal_cohorts=2
    keys = [sub(0, gid=f"m{n}").key for n in range(3)]
    for key in keys:
        held.mailbox(Tombstone(key, 3, "ab" * 32, {}, Failed("gone"), 0.0), time.time() + 600)
    found = [held.unexpired_mailbox(key, time.time()) for key in keys]
    assert found[0] is None
    assert [t.key for t in found[1:] if t is not None] == keys[1:]


def test_an_index_nobody_polls_keeps_no_more_than_twice_what_is_filed() -> None:
    """In one process deadlines are timers and their index is never polled for due
    keys: what a removal leaves behind in its heap must not pile up with every cohort."""
    index = Index()
    for n in range(10_000):
        key = sub(0, gid=f"g{n}").key
        index.file(key, 1000.0 + n)
        index.file(key, 2000.0 + n)  # refiled (a filled cohort's evaluation deadline)
        index.remove(key)  # ended
    index.file(sub(0, gid="last").key, 5.0)
    assert len(index._heap) <= 2 * len(index.at) + 64
    assert index.due(10.0, 10) == [sub(0, gid="last").key]


async def test_an_ended_cohort_with_a_tombstone_is_read_from_it_not_from_a_mailbox() -> None:
    groups = LocalGroups(SETTINGS, lease_s=10)
    tomb = await _end_one(groups, "told")
    assert groups.state.mailboxes == {}  # the same outcome is not kept twice
    found = await groups.outcomes([tomb.key])
    assert found[tomb.key].outcome == tomb.outcome


async def test_a_commits_ends_reach_the_other_stores_listeners_not_its_own() -> None:
    """Its own runtime has them from its commit; a second store sharing the state (a
    second replica, in the tests) hears them from the fan-out."""
    first = LocalGroups(SETTINGS, lease_s=10)
    second = LocalGroups(SETTINGS, lease_s=10, shared_with=first)
    heard: dict[str, list[object]] = {"first": [], "second": []}
    stopping = asyncio.Event()

    async def nothing() -> None:
        return None

    listening = [
        asyncio.ensure_future(store.listen(heard[name].append, nothing, stopping=stopping))
        for name, store in (("first", first), ("second", second))
    ]
    await asyncio.sleep(0)
    tomb = await _end_one(first, "fanned")
    for _ in range(5):
        await asyncio.sleep(0)
    assert heard == {"first": [], "second": [tomb.key]}
    stopping.set()
    await asyncio.gather(*listening)


async def test_a_group_a_written_commit_leaves_idle_is_forgotten(tmp_path: Path) -> None:
    """Nothing of a group is kept once it holds nothing, commits to a file included
    (the write's own pending mark must not keep it)."""
    groups = await _opened(tmp_path / "state.sqlite3")
    key = sub(0, gid="marked").key
    scope = key.group_scope
    assert scope is not None
    state = await groups.load(key)
    mark = WatermarkRecord(scope, 0, time.time() + 60)
    assert (await groups.commit(state, [mark])).written
    assert groups.state.known(scope)
    state = await groups.load(key)
    assert (await groups.commit(state, [DropWatermark(scope)])).written
    assert not groups.state.known(scope)
    await groups.store.close()


async def test_commits_begun_in_one_loop_turn_reach_the_file_as_one_batch(tmp_path: Path) -> None:
    """Three groups' commits begun in one turn: one batch for the writer thread, each
    commit written and held; a commit begun just before the store closes is written
    too (the close sends what is queued first) and read back by the next process."""
    path = tmp_path / "state.sqlite3"
    groups = await _opened(path)
    assert isinstance(groups.behind, SqliteStore)
    before = groups.behind.stats.batches
    begun = []
    for gid in ("x", "y", "z"):
        state = await groups.load(sub(0, gid=gid).key)
        registry, now = _decide(state)
        begun.append(groups.begin_commit(state, registry.submit(sub(0, gid=gid), now).records))
    assert all(isinstance(b, asyncio.Future) for b in begun)  # nothing held before the file
    written = await asyncio.wait_for(asyncio.gather(*begun), 10)  # type: ignore[arg-type]
    assert all(w.written for w in written)
    assert groups.behind.stats.batches == before + 1
    assert (await groups.census(time.time()))[0] == 3

    state = await groups.load(sub(0, gid="last").key)
    registry, now = _decide(state)
    last = groups.begin_commit(state, registry.submit(sub(0, gid="last"), now).records)
    await groups.store.close()
    assert isinstance(last, asyncio.Future) and last.result().written
    again = await _opened(path)
    assert (await again.census(time.time()))[0] == 4
    await again.store.close()


async def test_retained_cohorts_add_no_object_a_garbage_collection_walks() -> None:
    """Tombstones, watermarks and the groups that hold only them are plain tuples and
    bytes (as memory://): a full collection costs the same with many retained cohorts
    as with none, which keeps p99 flat as they accumulate (make bench §4)."""
    settings = Settings(store="memory://", cohort_collection_timeout_s=60.0)
    groups = LocalGroups(settings, lease_s=10)
    await groups.connect()

    async def end(count: int, first: int) -> None:
        for n in range(first, first + count):
            await _end_one(groups, f"retained-{n}")

    await end(300, 0)  # code paths, caches and the first objects of each kind made
    gc.collect()
    before = len(gc.get_objects())
    await end(300, 300)
    gc.collect()
    grown = len(gc.get_objects()) - before
    held = groups.state
    assert len(held.tombstones) == 600 and len(held.watermarks) == 600
    assert not held.groups and len(held.resting) == 600  # no Group object kept
    assert grown < 30, f"{grown} more tracked objects for 300 more retained cohorts"
    # A resting group is read, decided on and committed as any other.
    state = await groups.load(sub(0, gid="retained-5", attempt=1).key)
    assert state.version != "0" and state.recovered.watermarks[0].attempt == 0


async def test_commits_in_flight_past_the_bound_drop_each_tombstone_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``max_terminal_cohorts`` (2 here) each new tombstone drops the oldest. Commits
    begun while earlier ones are being written to the file must not drop the same
    tombstones again: each is dropped once (it once cost a 1-member group 3x its CPU)."""
    groups = await _opened(tmp_path / "state.sqlite3")
    for gid in ("first", "second"):
        await _end_one(groups, gid)
    file = groups.behind
    assert file is not None
    dropped: list[object] = []
    persist = file.persist

    def counted(records: Sequence[Record]) -> asyncio.Future[None]:
        dropped.extend(r.key for r in records if isinstance(r, DropTombstone))
        return persist(records)

    monkeypatch.setattr(file, "persist", counted)
    await asyncio.gather(*(_end_one(groups, f"more-{n}") for n in range(6)))
    # Tombstones still being written are not counted yet: what they leave over the
    # bound goes at the next commit or census (the store watcher's, every second).
    await groups.census(time.time())
    await asyncio.sleep(0)  # the census's drops reach the file in the next loop turn
    assert len(dropped) == len(set(dropped)) == 6, dropped
    assert len(groups.state.tombstones) == 2
    await groups.store.close()


async def test_past_a_bound_of_64_or_more_the_oldest_64th_goes_at_once_and_nothing_until_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``max_terminal_cohorts`` 128, the insert that passes the bound drops the
    oldest down to 126 (1/64 of the bound below it) in one commit; the next two inserts
    drop nothing (there is room again), and the bound holds at every commit."""
    settings = Settings(
        store="memory://", cohort_collection_timeout_s=60.0, max_terminal_cohorts=128
    )
    groups = LocalGroups(settings, lease_s=10)
    drops_per_commit: list[int] = []
    begin = groups.begin_commit

    def counted(state: GroupState, records: Sequence[Record], **kw: object) -> object:
        before = len(groups.state.tombstones)
        answer = begin(state, records, **kw)  # type: ignore[arg-type]
        added = sum(1 for r in records if isinstance(r, TombstoneRecord))
        drops_per_commit.append(before + added - len(groups.state.tombstones))
        assert len(groups.state.tombstones) <= 128
        return answer

    monkeypatch.setattr(groups, "begin_commit", counted)
    ended = [await _end_one(groups, f"g{n}") for n in range(131)]
    assert [n for n in drops_per_commit if n] == [3]
    assert len(groups.state.tombstones) == 128
    gone = {(t.key.group_id, t.key.legacy_key, t.key.attempt, t.key.principal) for t in ended[:3]}
    assert not set(groups.state.tombstones) & gone
