"""GroupDecisions at a stop: a caller never waits for a decision nobody will make.

Over the in-process group store, with the loop's own ordering as the schedule: no
sleeps decide the interleaving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from genrm_grpc.cohort.events import MemberArrived
from genrm_grpc.config import Settings
from genrm_grpc.runtime.group_decisions import GroupDecisions
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.records import StoreError
from tests.cohort.support import sub

SETTINGS = Settings(store="memory://", runtime="groups", cohort_collection_timeout_s=60.0)


def _decisions() -> tuple[GroupDecisions, list[asyncio.Task[None]]]:
    owned: list[asyncio.Task[None]] = []

    def own(coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        owned.append(task)
        return task

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
