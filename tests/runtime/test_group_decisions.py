"""GroupDecisions at a stop: a caller never waits for a decision nobody will make.

Over the in-process group store, with the loop's own ordering as the schedule: no
sleeps decide the interleaving.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from genrm_grpc.cohort.events import Cancelled, MemberArrived
from genrm_grpc.cohort.records import DropCohort, TombstoneRecord, WatermarkRecord
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, SubmitDecision
from genrm_grpc.config import Settings
from genrm_grpc.runtime.decided import Op, decide_ops
from genrm_grpc.runtime.group_decisions import GroupDecisions
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.memory import MemoryStore
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.sqlite import SqliteStore
from tests.cohort.support import sub

SETTINGS = Settings(store="memory://", cohort_collection_timeout_s=60.0)


def _decisions(
    groups: LocalGroups | None = None,
) -> tuple[GroupDecisions, list[asyncio.Task[None]]]:
    owned: list[asyncio.Task[None]] = []

    def own(coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        owned.append(task)
        return task

    if groups is None:
        groups = LocalGroups(SETTINGS, lease_s=10)
    decisions = GroupDecisions(
        groups,
        SETTINGS,
        draining=lambda: False,
        own=own,
        committed=lambda *_: None,
        clock=groups.clock,
    )
    return decisions, owned


async def test_a_decision_cancelled_before_its_first_step_fails_its_caller() -> None:
    decisions, owned = _decisions()
    call = asyncio.ensure_future(decisions.apply(sub(0).key, MemberArrived(sub(0))))
    await asyncio.sleep(0)  # the call queued its event and made the task, not yet run
    (drain,) = owned
    drain.cancel()
    with pytest.raises(StoreError, match="cancelled"):
        await asyncio.wait_for(call, 5)


async def test_events_queued_behind_a_cancelled_decision_fail_with_it() -> None:
    decisions, owned = _decisions()
    key = sub(0).key
    first = asyncio.ensure_future(decisions.apply(key, MemberArrived(sub(0))))
    await asyncio.sleep(0)
    (drain,) = owned
    await asyncio.sleep(0)  # the decision runs: it waits out its batch window
    second = asyncio.ensure_future(decisions.apply(key, MemberArrived(sub(1))))
    await asyncio.sleep(0)
    assert len(owned) == 1  # queued behind the first, no decision of its own
    drain.cancel()
    for call in (first, second):
        with pytest.raises(StoreError, match="cancelled"):
            await asyncio.wait_for(call, 5)


async def test_a_one_member_groups_member_is_decided_without_the_batch_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It has no sibling to wait for: decided in the loop turns that follow, while a
    larger group's first member waits out the window for the others."""
    monkeypatch.setattr("genrm_grpc.runtime.group_decisions.BATCH_WINDOW_S", 3600.0)
    decisions, owned = _decisions()
    alone = sub(0, gid="solo", size=1)
    decided = await asyncio.wait_for(decisions.apply(alone.key, MemberArrived(alone)), 5)
    assert decided is not None
    first = sub(0, gid="big", size=2)
    waiting = asyncio.ensure_future(decisions.apply(first.key, MemberArrived(first)))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiting.done()
    for task in owned:
        task.cancel()
    with pytest.raises(StoreError):
        await waiting


async def test_an_in_process_one_member_decision_needs_no_task_and_answers_in_the_call() -> None:
    """On the in-process store nothing in it waits: decided, committed and answered
    before the call first yields, with no decision task (the replicas' Redis store
    always takes a round trip, so a drain task decides there)."""
    groups = LocalGroups(SETTINGS, lease_s=10)
    decisions, owned = _decisions(groups)
    alone = sub(0, gid="solo", size=1)
    decided = await decisions.apply(alone.key, MemberArrived(alone))
    assert isinstance(decided, SubmitDecision) and decided.frozen
    assert alone.key in groups.state.cohorts
    assert owned == []


def _writes_held(path: Path) -> tuple[LocalGroups, sqlite3.Connection]:
    """An in-process store over a SQLite file whose writer waits for a lock held by a
    second connection until the test rolls it back."""
    groups = LocalGroups(SETTINGS, lease_s=10, behind=SqliteStore(path))
    lock = sqlite3.connect(path, isolation_level=None)
    return groups, lock


async def _until_written_pending(groups: LocalGroups, scope: str) -> None:
    for _ in range(1000):
        group = groups.state.groups.get(scope)
        if group is not None and group.pending is not None:
            return
        await asyncio.sleep(0)
    raise AssertionError("the commit never reached the file")


async def test_a_caller_cancelled_during_its_commits_write_leaves_the_commit_held(
    tmp_path: Path,
) -> None:
    """The write goes on without its caller (a client that hung up): once the file has
    it, the store holds it too, and the member's resend is answered from it (attached to
    the cohort it froze), not decided a second time."""
    path = tmp_path / "state.sqlite3"
    groups, lock = _writes_held(path)
    await groups.connect()
    decisions, owned = _decisions(groups)
    alone = sub(0, gid="solo", size=1)
    try:
        lock.execute("BEGIN IMMEDIATE")
        call = asyncio.ensure_future(decisions.apply(alone.key, MemberArrived(alone)))
        await _until_written_pending(groups, alone.key.group_scope or "")
        assert owned == []  # committing by callback: no task to cancel
        call.cancel()
        resend = asyncio.ensure_future(decisions.apply(alone.key, MemberArrived(alone)))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not resend.done()  # queued behind the write
        lock.execute("ROLLBACK")
    finally:
        lock.close()
    resent = await asyncio.wait_for(resend, 10)
    assert isinstance(resent, SubmitDecision)
    assert resent.disposition is Disposition.ATTACHED
    assert alone.key in groups.state.cohorts
    await groups.store.close()


async def test_a_commit_written_after_the_runtime_stopped_answers_nobody(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    groups, lock = _writes_held(path)
    await groups.connect()
    committed: list[object] = []
    decisions = GroupDecisions(
        groups,
        SETTINGS,
        draining=lambda: False,
        own=lambda coro, *, name: asyncio.get_running_loop().create_task(coro, name=name),
        committed=lambda *args: committed.append(args),
        clock=groups.clock,
    )
    alone = sub(0, gid="solo", size=1)
    try:
        lock.execute("BEGIN IMMEDIATE")
        call = asyncio.ensure_future(decisions.apply(alone.key, MemberArrived(alone)))
        await _until_written_pending(groups, alone.key.group_scope or "")
        decisions.stop()
        lock.execute("ROLLBACK")
    finally:
        lock.close()
    with pytest.raises(StoreError, match="stopped"):
        await asyncio.wait_for(call, 10)
    assert committed == []  # nothing started or delivered here
    assert alone.key in groups.state.cohorts  # what was written is held
    await groups.store.close()


async def test_a_round_that_freezes_and_settles_a_cohort_commits_no_header_or_member() -> None:
    """A 1-member group is accepted and scored in one round (two calls of the
    registry): its store is given the end state, a drop and a tombstone, never a header
    or member it would write only to delete."""
    registry = CohortRegistry(SETTINGS, MemoryStore(SETTINGS))
    registry.defer_records = True  # as GroupDecisions.group_registry() makes it
    alone = sub(0, gid="solo", size=1)
    op = Op(MemberArrived(alone), asyncio.get_running_loop().create_future())
    done = decide_ops(
        alone.key, [op], registry, 1000.0, lambda cohort: Cancelled(cohort.key, cohort.seq, "x")
    )
    assert [c.key for c in done.ended] == [alone.key]
    kinds = {type(r) for r in done.records}
    assert kinds == {WatermarkRecord, DropCohort, TombstoneRecord}


async def test_a_bug_after_a_written_commit_fails_its_caller_instead_of_hanging_it(
    tmp_path: Path,
) -> None:
    """The commit completes in a callback of the file's write, which has no caller to
    raise to: what fails there reaches the op's caller."""
    groups = LocalGroups(SETTINGS, lease_s=10, behind=SqliteStore(tmp_path / "s.sqlite3"))
    await groups.connect()

    def committed(*_: object) -> None:
        raise RuntimeError("a bug in what a commit means here")

    decisions = GroupDecisions(
        groups,
        SETTINGS,
        draining=lambda: False,
        own=lambda coro, *, name: asyncio.get_running_loop().create_task(coro, name=name),
        committed=committed,
        clock=groups.clock,
    )
    alone = sub(0, gid="solo", size=1)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(decisions.apply(alone.key, MemberArrived(alone)), 10)
    await groups.store.close()
