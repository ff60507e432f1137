"""The replicas' group read and fenced group commit, on both sides of the seam.

Two ``SharedGroups`` on one real redis-server stand for two replicas, and so do two
``LocalGroups`` sharing one in-process state: the same contract holds for both. Each
test drives the interleaving by hand (read here, commit there), so the races are
deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from genrm_grpc.cohort.model import CohortKey, Masked, Phase, Tombstone
from genrm_grpc.cohort.registry import CohortRegistry, Disposition
from genrm_grpc.config import Settings
from genrm_grpc.runtime.group_store import GroupStore
from genrm_grpc.store.group_state import GroupState
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.redis import RedisStore
from genrm_grpc.store.shared import SharedGroups
from tests.cohort.support import sub
from tests.store.samples import decide_on

SETTINGS = Settings(store="memory://", cohort_collection_timeout_s=60.0)


async def _replica(url: str, lease_s: float) -> SharedGroups:
    store = RedisStore(url)
    shared = SharedGroups(store, lease_s=lease_s)
    await shared.connect()
    await store.start()
    return shared


Pair = Callable[..., contextlib.AbstractAsyncContextManager[tuple[GroupStore, GroupStore]]]


@pytest.fixture(params=["redis", "local"])
def two_replicas(request: pytest.FixtureRequest) -> Pair:
    """Two replicas' access to one deployment's groups: on Redis, or in process."""

    @contextlib.asynccontextmanager
    async def pair(lease_s: float = 5.0) -> AsyncIterator[tuple[GroupStore, GroupStore]]:
        if request.param == "local":
            one = LocalGroups(SETTINGS, lease_s=lease_s, replica="one")
            yield one, LocalGroups(SETTINGS, lease_s=lease_s, replica="two", shared_with=one)
            return
        url = request.getfixturevalue("redis_url")
        first, second = await _replica(url, lease_s), await _replica(url, lease_s)
        try:
            yield first, second
        finally:
            await first.store.close()
            await second.store.close()

    return pair


def _decide(state: GroupState) -> tuple[CohortRegistry, float]:
    return decide_on(state, SETTINGS)


async def test_a_commit_on_a_stale_read_is_refused_and_writes_nothing(two_replicas: Pair) -> None:
    async with two_replicas() as (one, two):
        key = sub(0).key
        seen_by_one = await one.load(key)
        seen_by_two = await two.load(key)
        reg_two, now = _decide(seen_by_two)
        accepted = reg_two.submit(sub(0), now)
        assert (await two.commit(seen_by_two, accepted.records)).written
        # Replica one decided on the state before replica two's commit: refused.
        reg_one, now = _decide(seen_by_one)
        other = reg_one.submit(sub(0, text="a different answer"), now)
        assert other.disposition is Disposition.ACCEPTED  # on its stale view
        refused = await one.commit(seen_by_one, other.records)
        assert not refused.written and not refused.lease_lost
        assert one.stats.conflicts == 1
        # Read again: slot 0 holds replica two's member, so the same member conflicts.
        fresh = await one.load(key)
        reg_one, now = _decide(fresh)
        assert reg_one.submit(sub(0, text="a different answer"), now).rejection is not None
        assert fresh.active_total == 1 and fresh.active_principal == 1


async def test_an_evaluation_result_under_a_lost_lease_is_refused(two_replicas: Pair) -> None:
    async with two_replicas(lease_s=0.2) as (one, two):
        key = sub(0, size=1).key
        state = await one.load(key)
        reg, now = _decide(state)
        frozen = reg.submit(sub(0, size=1), now)
        assert frozen.frozen
        taken = await one.commit(state, frozen.records, evaluate=key)
        assert taken.written and taken.token > 0
        lease = one.lease_for(key, taken.token)
        assert await two.claim(key) is None  # held
        # Replica one stops renewing (a pause); Redis expires its 200 ms lease.
        other = None
        deadline = time.monotonic() + 10
        while other is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
            if await two.orphaned(time.time()) == [key]:
                other = await two.claim(key)
        assert other.token > lease.token
        # Replica one finishes late: its result is refused, nothing is written.
        state = await one.load(key)
        reg, now = _decide(state)
        cohort = reg.active(key)
        assert cohort is not None
        ended = reg.judge_failed(cohort, "late", now)
        assert ended
        late = await one.commit(state, ended.records, fence=lease)
        assert late.lease_lost and not late.written
        assert await one.renew(key, lease) is None
        # The group is unchanged: still evaluating, under replica two's lease.
        assert (await two.load(key)).recovered.cohorts[0].header.phase is Phase.EVALUATING


async def test_an_ended_cohort_leaves_its_outcome_for_other_replicas_and_a_message(
    two_replicas: Pair,
) -> None:
    async with two_replicas() as (one, two):
        told: asyncio.Queue[CohortKey] = asyncio.Queue()
        subscribed = asyncio.Event()
        stopping = asyncio.Event()

        async def on_subscribed() -> None:
            subscribed.set()

        listening = asyncio.create_task(
            two.listen(told.put_nowait, on_subscribed, stopping=stopping)
        )
        try:
            await asyncio.wait_for(subscribed.wait(), 10)
            key = CohortKey("g", None, 0)
            state = await one.load(key)
            reg, now = _decide(state)
            accepted = reg.submit(sub(0), now)
            assert (await one.commit(state, accepted.records)).written
            state = await one.load(key)
            reg, now = _decide(state)
            cohort = reg.active(key)
            assert cohort is not None
            ended = reg.fail(cohort, "cancelled by a test", now)
            assert ended
            outcome = Tombstone(key, 3, cohort.prompt_digest, {}, ended[0].outcome, now)  # type: ignore[arg-type]
            assert (await one.commit(state, ended.records, ended=[outcome])).written
            assert await asyncio.wait_for(told.get(), 5) == key
            found = await two.outcomes([key, CohortKey("never", None, 0)])
            assert list(found) == [key]
            assert not isinstance(found[key].outcome, Masked)
            assert (await two.load(key)).active_total == 0  # the count went back down
            assert await two.due(time.time() + 3600) == []  # and its deadline left the index
        finally:
            stopping.set()
            await asyncio.wait_for(listening, 10)


async def test_a_released_evaluation_is_due_for_takeover_at_once(two_replicas: Pair) -> None:
    async with two_replicas(lease_s=60) as (one, two):
        key = sub(0, size=1).key
        state = await one.load(key)
        reg, now = _decide(state)
        taken = await one.commit(state, reg.submit(sub(0, size=1), now).records, evaluate=key)
        assert await two.orphaned(time.time()) == []  # a 60 s lease, just taken
        await one.release(key, one.lease_for(key, taken.token))
        assert await two.orphaned(time.time()) == [key]
        assert await two.claim(key) is not None
