"""One replica's runtime in process: evaluation, its journal, several replicas.

On a real redis-server, and (``deployment``) also over the in-process group store with
two runtimes sharing one ``LocalGroups`` state: the protocol is the same on both sides
of the seam. What only Redis can show (its keys, a hand-off to another process) stays
on Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis

from genrm_grpc.cohort.model import Completed, Failed, Reason
from genrm_grpc.cohort.records import WatermarkRecord
from genrm_grpc.cohort.registry import Disposition
from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeInput, JudgeOutcome
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.redis import RedisStore
from genrm_grpc.store.shared import SharedGroups
from tests.cohort.support import sub
from tests.redis_support import RedisServer

SIZE = 16


class InstantJudge:
    """Answers at once: the outcome is ready while the journal writes are still queued."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls = 0

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return JudgeOutcome(Verdict(4.0, 3.0, 2.5, False), None, 1)


async def _runtime(
    redis_url: str, judge: InstantJudge | None = None, **config: object
) -> ReplicaRuntime:
    settings = Settings(store=redis_url, **config)  # type: ignore[arg-type]
    runtime = ReplicaRuntime(
        judge or InstantJudge(),
        settings,
        shared=SharedGroups(RedisStore(redis_url), lease_s=10),
    )
    await runtime.open()
    return runtime


Make = Callable[..., Awaitable[ReplicaRuntime]]


@pytest.fixture(params=["redis", "local"])
async def deployment(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """Make replicas of one deployment: on Redis, or over one in-process group store."""
    made: list[ReplicaRuntime] = []
    local: list[LocalGroups] = []

    async def make(judge: InstantJudge | None = None, **config: object) -> ReplicaRuntime:
        if request.param == "redis":
            runtime = await _runtime(request.getfixturevalue("redis_url"), judge, **config)
        else:
            settings = Settings(store="memory://", **config)  # type: ignore[arg-type]
            shared = LocalGroups(settings, lease_s=10, shared_with=local[0] if local else None)
            local.append(shared)
            runtime = ReplicaRuntime(
                judge or InstantJudge(),
                settings,
                shared=shared,
            )
            await runtime.open()
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        await runtime.shutdown(0)
        await runtime.close()


@pytest.fixture
async def replica(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[ReplicaRuntime]:
    runtime = await _runtime(redis_url, getattr(request, "param", None))
    try:
        yield runtime
    finally:
        await runtime.shutdown(0)
        await runtime.close()


async def _group(runtime: ReplicaRuntime, gid: str) -> list[object]:
    tickets = await asyncio.gather(
        *(runtime.submit(sub(k, gid=gid, size=SIZE, text=f"{gid}-{k}")) for k in range(SIZE))
    )
    return list(await asyncio.gather(*(t.waiter.wait() for t in tickets if t.waiter is not None)))


async def test_every_pass_is_journaled_before_the_outcome_is_committed(
    replica: ReplicaRuntime, redis_url: str
) -> None:
    groups = await asyncio.gather(*(_group(replica, f"fast-{n}") for n in range(8)))
    assert all(isinstance(o, Completed) for outcomes in groups for o in outcomes)
    client = aioredis.Redis.from_url(redis_url)
    try:
        journals = await client.keys("genrm:v:*")
        # circular: one pass per member, each journaled under its cohort (kept for reuse
        # by a later attempt while the tombstone lives).
        assert len(journals) == 8
        assert [await client.hlen(name) for name in journals] == [SIZE] * 8
    finally:
        await client.aclose()


async def test_an_evaluation_bug_fails_the_cohort_instead_of_leaving_it_evaluating(
    deployment: Make,
) -> None:
    replica = await deployment(InstantJudge(error=RuntimeError("a bug")))
    outcomes = await asyncio.wait_for(_group(replica, "buggy"), 30)
    assert all(isinstance(o, Failed) and "evaluation failed" in o.reason for o in outcomes)
    assert replica.stats()["evaluating_here"] == 0


async def test_a_replica_never_answers_from_the_state_of_its_own_last_commit_once_stale(
    deployment: Make,
) -> None:
    """A replica decides the next event of a group on the state its own commit left;
    another replica's write since then must never let it answer from that state."""
    one, two = await deployment(), await deployment()
    first = await one.submit(sub(0, gid="g", size=SIZE, text="zero"))
    assert first.disposition is Disposition.ACCEPTED
    assert one.shared.stats.loads == 1
    # A second member on the same replica: decided on its cached state, no read.
    second = await one.submit(sub(1, gid="g", size=SIZE, text="one"))
    assert second.disposition is Disposition.ACCEPTED
    assert one.shared.stats.loads == 1
    # Replica two opens attempt 1 of the group: attempt 0 is superseded.
    newer = await two.submit(sub(0, gid="g", attempt=1, size=SIZE, text="new"))
    assert newer.disposition is Disposition.ACCEPTED
    # The identical resend would be ATTACHED on replica one's cached state (no write,
    # hence no commit to refuse it): the version check makes it read the group.
    resend = await one.submit(sub(1, gid="g", size=SIZE, text="one"))
    assert resend.rejection is not None
    assert resend.rejection.reason is Reason.ATTEMPT_SUPERSEDED
    # A write decided on a stale state is refused by the commit and decided again.
    fresh = await one.submit(sub(1, gid="g", attempt=1, size=SIZE, text="b"))
    assert fresh.disposition is Disposition.ACCEPTED
    assert one.shared.stats.loads >= 2


async def test_a_commit_on_another_group_in_between_costs_no_read_and_no_conflict(
    deployment: Make,
) -> None:
    """The state a commit leaves is at the version the store answered: on the in-process
    store versions come from one counter for every group, so another group's commit in
    between must not make the next decision on this group conflict and decide again."""
    replica = await deployment()
    await replica.submit(sub(0, gid="other", size=SIZE, text="other"))
    await replica.submit(sub(0, gid="g", size=SIZE, text="zero"))
    await replica.submit(sub(1, gid="other", size=SIZE, text="other-1"))
    loads, conflicts = replica.shared.stats.loads, replica.shared.stats.conflicts
    second = await replica.submit(sub(1, gid="g", size=SIZE, text="one"))
    assert second.disposition is Disposition.ACCEPTED
    assert (replica.shared.stats.loads, replica.shared.stats.conflicts) == (loads, conflicts)


class HangingJudge:
    """Never answers; counts the calls it got and those cancelled while waiting."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0
        self.called = asyncio.Event()

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        self.calls += 1
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


async def test_a_cohort_cancelled_on_another_replica_fails_its_waiters_and_stops_the_judging(
    deployment: Make,
) -> None:
    judge = HangingJudge()
    one, two = await deployment(judge), await deployment()
    size = 2
    tickets = [await one.submit(sub(k, gid="c", size=size, text=f"c-{k}")) for k in range(size)]
    waits = [asyncio.ensure_future(t.waiter.wait()) for t in tickets if t.waiter is not None]
    await asyncio.wait_for(judge.called.wait(), 30)  # replica one evaluates the cohort
    key = sub(0, gid="c", size=size, text="c-0").key
    assert await two.cancel_cohort(key, "stopped by ops")
    outcomes = await asyncio.wait_for(asyncio.gather(*waits), 30)
    assert all(isinstance(o, Failed) and o.reason == "stopped by ops" for o in outcomes)
    await asyncio.wait_for(one.drain_tasks(), 30)
    assert judge.cancelled == judge.calls > 0
    assert one.stats()["evaluating_here"] == 0
    late = await two.submit(sub(0, gid="c", size=size, text="c-0"))
    assert late.rejection is not None and late.rejection.reason is Reason.COHORT_FAILED
    assert "stopped by ops" in late.rejection.message
    assert not await two.cancel_cohort(key, "again")


class CountingJudge(InstantJudge):
    """An instant judge that wakes whoever waits for its call count to reach a figure."""

    def __init__(self) -> None:
        super().__init__()
        self.counted = asyncio.Condition()

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        outcome = await super().judge(inp, swap=swap)
        async with self.counted:
            self.counted.notify_all()
        return outcome

    async def reached(self, calls: int) -> None:
        async with asyncio.timeout(30), self.counted:
            await self.counted.wait_for(lambda: self.calls >= calls)


def _early_passes(size: int, present: set[int]) -> int:
    """Passes an eager evaluator can start with only ``present`` stored."""
    plan = Settings().pass_plan()
    return len({p.order for m in present for p in plan.passes_with(size, m, present)})


async def test_eager_replicas_judge_before_the_group_is_in_and_each_pass_once(
    deployment: Make,
) -> None:
    size = 4
    first, second = CountingJudge(), CountingJudge()
    one = await deployment(first, judge_schedule="eager")
    two = await deployment(second, judge_schedule="eager")
    subs = [sub(k, gid="e", size=size, text=f"e-{k}") for k in range(size)]
    tickets = [await (one if k % 2 == 0 else two).submit(subs[k]) for k in range(size - 1)]
    # Member 0 made replica one the evaluator; it judges what members 0-2 allow,
    # member 1 having arrived on replica two.
    early = _early_passes(size, {0, 1, 2})
    assert early > 0
    await first.reached(early)
    assert first.calls == early and second.calls == 0
    tickets.append(await two.submit(subs[-1]))
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(t.waiter.wait() for t in tickets if t.waiter is not None)), 30
    )
    assert len(outcomes) == size
    assert all(isinstance(o, Completed) for o in outcomes)
    assert first.calls == Settings().pass_plan().pass_count(size)
    assert second.calls == 0


async def test_an_eager_evaluator_that_stops_hands_the_cohort_to_the_one_that_freezes_it(
    redis_url: str,
) -> None:
    size = 4
    first, second = CountingJudge(), CountingJudge()
    one = await _runtime(redis_url, first, judge_schedule="eager")
    two = await _runtime(redis_url, second, judge_schedule="eager")
    try:
        subs = [sub(k, gid="h", size=size, text=f"h-{k}") for k in range(size)]
        for k in range(size - 1):
            await (one if k % 2 == 0 else two).submit(subs[k])
        early = _early_passes(size, {0, 1, 2})
        await first.reached(early)
        await one.shutdown(0)  # releases the lease; its journaled verdicts stay
        last = await two.submit(subs[-1])
        assert last.waiter is not None
        outcome = await asyncio.wait_for(last.waiter.wait(), 30)
        assert isinstance(outcome, Completed)
        # Replica two judged only what replica one had not journaled: nothing twice.
        assert first.calls + second.calls == Settings().pass_plan().pass_count(size)
        assert two.stats()["passes_resumed"] == early
    finally:
        for runtime in (two, one):
            await runtime.shutdown(0)
            await runtime.close()


async def test_a_one_member_group_is_scored_in_the_commit_that_froze_it(
    deployment: Make,
) -> None:
    """Nothing to judge: no evaluation lease, no second commit, the outcome at once."""
    judge = InstantJudge()
    replica = await deployment(judge)
    ticket = await replica.submit(sub(0, gid="solo", size=1, text="alone"))
    assert ticket.disposition is Disposition.ACCEPTED and ticket.waiter is not None
    outcome = await asyncio.wait_for(ticket.waiter.wait(), 10)
    assert isinstance(outcome, Completed)
    assert replica.shared.stats.commits == 1
    assert replica.stats()["evaluating_here"] == 0 and judge.calls == 0
    resend = await replica.submit(sub(0, gid="solo", size=1, text="alone"))
    assert resend.disposition is Disposition.REPLAYED


async def test_a_stop_on_a_store_nothing_outlives_fails_the_cohorts_as_memory_promises() -> None:
    settings = Settings(store="memory://")
    runtime = ReplicaRuntime(
        InstantJudge(),
        settings,
        shared=LocalGroups(settings, lease_s=10),
    )
    await runtime.open()
    ticket = await runtime.submit(sub(0, gid="left", size=2, text="only one"))
    assert ticket.waiter is not None
    await runtime.shutdown(0)
    await runtime.close()
    outcome = await asyncio.wait_for(ticket.waiter.wait(), 10)
    assert isinstance(outcome, Failed) and outcome.reason == "server is shutting down"


async def test_a_journal_write_redis_did_not_take_counts_as_a_store_failure(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """store_failures (genrm_store_write_failures_total) counts the replica's journal
    batches too, not only its group commits."""
    server = redis_factory()
    runtime = await _runtime(server.url)
    try:
        assert runtime.stats()["store_failures"] == 0
        server.stop()
        with pytest.raises(StoreError):
            await runtime.store.persist([WatermarkRecord("journaled", 1, 2e9)])
        assert runtime.stats()["store_failures"] == 1
    finally:
        server.restart()
        await runtime.shutdown(0)
        await runtime.close()
