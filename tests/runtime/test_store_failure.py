"""A store whose writes fail: the calls get STORE_UNAVAILABLE, the outcome is written again.

The store is a small DurableStore whose ``persist`` fails the next N writes when the
test says so; time is a ManualClock, so each retry of an ended cohort's final records
(every ``REWRITE_DELAY_S``) happens exactly when the test advances it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from genrm_grpc.cohort.model import Completed, Phase, Reason
from genrm_grpc.cohort.records import (
    MemberRecord,
    Record,
    Recovered,
    TombstoneRecord,
    VerdictRecord,
)
from genrm_grpc.cohort.registry import Disposition
from genrm_grpc.runtime.live import REWRITE_DELAY_S, CallInterrupted, Ticket
from genrm_grpc.store.records import StoreError
from genrm_grpc.testing import ManualClock

from .support import (
    Runtime,
    ScriptedJudge,
    advance,
    close_runtime,
    make_runtime,
    open_runtime,
    phase_of,
    settle,
    sub,
    until,
)


class FlakyStore:
    """Keeps what it was given; fails the next ``failures`` writes with StoreError, and
    the next ``outcome_failures`` writes that carry a tombstone."""

    survives_restart = True

    def __init__(self) -> None:
        self.failures = 0
        self.outcome_failures = 0
        self.attempts: list[list[Record]] = []
        self.written: list[Record] = []

    async def open(self, now_wall: float) -> Recovered:
        return Recovered()

    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.attempts.append(list(records))
        if self.outcome_failures and any(isinstance(r, TombstoneRecord) for r in records):
            self.outcome_failures -= 1
            future.set_exception(StoreError("disk I/O error"))
        elif self.failures:
            self.failures -= 1
            future.set_exception(StoreError("disk I/O error"))
        else:
            self.written.extend(records)
            future.set_result(None)
        return future

    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        return None

    async def close(self) -> None:
        return None


async def answer(ticket: Ticket) -> object:
    """What a SubmitMember call answers: the outcome, or the CallInterrupted it raised."""
    try:
        await ticket.persisted()
        if ticket.replay is not None:
            return ticket.replay.outcome
        assert ticket.waiter is not None
        return await ticket.waiter.wait()
    except CallInterrupted as exc:
        return exc


def interrupted_by_store(got: object) -> bool:
    return isinstance(got, CallInterrupted) and got.reason is Reason.STORE_UNAVAILABLE


class HeldStore(FlakyStore):
    """A FlakyStore whose successful writes complete only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[asyncio.Future[None]] = []

    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        stored = super().persist(records)
        if stored.exception() is not None:
            return stored
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(held)
        return held

    def commit(self) -> None:
        for held in self.held:
            held.set_result(None)
        self.held.clear()


# The runtime (docs/architecture.md, "Time, failed writes, tests") writes first and holds
# nothing of a decision until it is written: the call whose commit failed gets
# STORE_UNAVAILABLE and the group stays as it was, and an evaluation's end is committed
# again every REWRITE_DELAY_S while its lease holds.


async def runtime_over(store: FlakyStore, judge: ScriptedJudge, clock: ManualClock) -> Runtime:
    made = make_runtime(judge, clock, behind=store)
    return await open_runtime(made)


async def _judged_with_every_member_written(
    judge: ScriptedJudge, store: FlakyStore, calls: list[asyncio.Future[object]]
) -> None:
    """The group's three pairs are judged, every call gets its reward, and the file
    holds each of the three members."""
    await until(lambda: len(judge.calls) == 3)
    judge.release_all()
    await settle()
    for call in calls:
        assert call.done() and isinstance(call.result(), Completed), call.result()
    slots = [r.coords.rollout_index for r in store.written if isinstance(r, MemberRecord)]
    assert sorted(set(slots)) == [0, 1, 2]


async def test_an_outcome_whose_commit_fails_is_committed_again_every_delay(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    """Nothing is answered meanwhile (the cohort has not ended until it is written):
    the waiting calls get the outcome once a retry is stored, not STORE_UNAVAILABLE."""
    store = FlakyStore()
    rt = await runtime_over(store, judge, clock)
    calls = [asyncio.ensure_future(answer(await rt.submit(sub(i)))) for i in range(3)]
    await settle()
    assert len(judge.calls) == 3
    store.outcome_failures = 4
    judge.release_all()
    await settle()
    failed_writes = len(store.attempts)
    assert not any(call.done() for call in calls)
    # An identical resend meanwhile reattaches (nothing to write) and waits with them.
    resend = asyncio.ensure_future(answer(await rt.submit(sub(0))))
    await settle()
    assert len(store.attempts) == failed_writes and not resend.done()
    for retry in range(3):
        await advance(clock, REWRITE_DELAY_S)
        assert len(store.attempts) == failed_writes + retry + 1
        assert not any(isinstance(r, TombstoneRecord) for r in store.written)
    assert not resend.done()
    await advance(clock, REWRITE_DELAY_S)  # the fifth write succeeds
    assert any(isinstance(r, TombstoneRecord) for r in store.written)
    assert all(isinstance(call.result(), Completed) for call in [*calls, resend])
    attempts = len(store.attempts)
    await advance(clock, 10 * REWRITE_DELAY_S)  # and nothing is written after it
    assert len(store.attempts) == attempts
    replays = [await rt.submit(sub(i)) for i in range(3)]
    assert all(t.disposition is Disposition.REPLAYED for t in replays)
    assert len(judge.calls) == 3
    await close_runtime(rt)


async def test_a_member_whose_commit_fails_gets_store_unavailable_and_a_resend_counts(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    store = FlakyStore()
    rt = await runtime_over(store, judge, clock)
    first = asyncio.ensure_future(answer(await rt.submit(sub(0))))
    store.failures = 1
    with pytest.raises(CallInterrupted) as lost:
        await rt.submit(sub(1))
    assert lost.value.reason is Reason.STORE_UNAVAILABLE
    assert not first.done()  # the other member's call goes on
    again = asyncio.ensure_future(answer(await rt.submit(sub(1))))
    last = asyncio.ensure_future(answer(await rt.submit(sub(2))))
    await _judged_with_every_member_written(judge, store, [first, again, last])
    await close_runtime(rt)


async def test_a_cohort_is_judged_only_once_the_commit_that_completed_it_is_stored(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    store = HeldStore()
    rt = await runtime_over(store, judge, clock)
    submits = [asyncio.ensure_future(rt.submit(sub(k))) for k in range(3)]
    await settle()
    assert store.held and judge.calls == []
    while not all(s.done() for s in submits):  # each commit waits for its write
        store.commit()
        await settle()
    calls = [asyncio.ensure_future(answer(s.result())) for s in submits]
    await until(lambda: len(judge.calls) == 3)
    judge.release_all()
    while not all(call.done() for call in calls):  # the verdicts and the outcome
        store.commit()
        await settle()
    assert all(isinstance(call.result(), Completed) for call in calls)
    await close_runtime(rt)


async def test_a_completing_member_whose_commit_fails_leaves_the_group_collecting(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    """Nothing of the failed commit is held, so nothing is written again and nothing is
    judged: the group waits, as it was, for the member's resend, which completes it."""
    store = FlakyStore()
    rt = await runtime_over(store, judge, clock)
    first = [asyncio.ensure_future(answer(await rt.submit(sub(k)))) for k in range(2)]
    store.failures = 1
    with pytest.raises(CallInterrupted) as lost:
        await rt.submit(sub(2))
    assert lost.value.reason is Reason.STORE_UNAVAILABLE
    attempts = len(store.attempts)
    for _ in range(3):
        await advance(clock, REWRITE_DELAY_S)
    assert len(store.attempts) == attempts and judge.calls == []
    assert await phase_of(rt, sub(0).key) is Phase.COLLECTING
    assert not any(call.done() for call in first)
    last = asyncio.ensure_future(answer(await rt.submit(sub(2))))  # the resend
    await _judged_with_every_member_written(judge, store, [*first, last])
    await close_runtime(rt)


async def test_retries_of_an_outcome_stop_when_the_runtime_is_stopped(
    clock: ManualClock, judge: ScriptedJudge
) -> None:
    """Its evaluation is this process's task: the drain cancels it with its rewrites, and
    the waiting calls are told to resend once the server is back (the file keeps the
    cohort, evaluating, for the next process)."""
    store = FlakyStore()
    rt = await runtime_over(store, judge, clock)
    calls = [asyncio.ensure_future(answer(await rt.submit(sub(i)))) for i in range(3)]
    await until(lambda: len(judge.calls) == 3)
    store.failures = 1_000
    judge.release_all()
    await settle()
    attempts = len(store.attempts)
    await advance(clock, REWRITE_DELAY_S)
    assert len(store.attempts) == attempts + 1  # the outcome is being written again
    await rt.shutdown(0)
    await rt.close()
    attempts = len(store.attempts)
    for _ in range(10):
        await advance(clock, REWRITE_DELAY_S)
    assert len(store.attempts) == attempts
    for call in calls:
        got = call.result()
        assert isinstance(got, CallInterrupted) and got.reason is Reason.SHUTTING_DOWN, got
