"""PrioritySemaphore: priority order, cancelled waiters, and the grant/cancel race."""

from __future__ import annotations

import asyncio

import pytest

from genrm_grpc.runtime.scheduler import PrioritySemaphore

from .support import settle, until


async def _acquire_and_record(
    sem: PrioritySemaphore, priority: tuple[int, ...], order: list[tuple[int, ...]]
) -> None:
    await sem.acquire(priority)
    order.append(priority)


def test_permits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PrioritySemaphore(0)


async def test_free_permits_are_taken_without_waiting() -> None:
    sem = PrioritySemaphore(2)
    await sem.acquire((5,))
    await sem.acquire((1,))
    assert sem.in_use == 2 and sem.waiting == 0
    sem.release()
    sem.release()
    assert sem.in_use == 0


async def test_permits_go_to_the_lowest_priority_value_first() -> None:
    sem = PrioritySemaphore(1)
    await sem.acquire((0,))
    order: list[tuple[int, ...]] = []
    priorities = [(2, 0), (1, 5), (1, 0), (3,), (1, 2)]
    tasks = [asyncio.create_task(_acquire_and_record(sem, p, order)) for p in priorities]
    await until(lambda: sem.waiting == len(priorities))
    for n in range(len(priorities)):
        sem.release()
        await until(lambda n=n: len(order) == n + 1)  # type: ignore[misc]
        assert sem.in_use == 1
    assert order == sorted(priorities)
    await asyncio.gather(*tasks)
    sem.release()
    assert sem.in_use == 0 and sem.waiting == 0


async def test_equal_priorities_are_served_first_come_first_served() -> None:
    sem = PrioritySemaphore(1)
    await sem.acquire((0,))
    order: list[int] = []

    async def take(n: int) -> None:
        await sem.acquire((7,))
        order.append(n)
        sem.release()

    tasks = []
    for n in range(5):
        tasks.append(asyncio.create_task(take(n)))
        await settle(2)
    sem.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert sem.in_use == 0


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    sem = PrioritySemaphore(1)
    await sem.acquire((0,))
    order: list[tuple[int, ...]] = []
    first = asyncio.create_task(_acquire_and_record(sem, (1,), order))
    second = asyncio.create_task(_acquire_and_record(sem, (2,), order))
    await until(lambda: sem.waiting == 2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert sem.waiting == 1
    sem.release()
    await second
    assert order == [(2,)] and sem.in_use == 1
    sem.release()
    assert sem.in_use == 0


async def test_a_permit_granted_to_a_waiter_cancelled_in_the_same_tick_is_passed_on() -> None:
    sem = PrioritySemaphore(1)
    await sem.acquire((0,))
    order: list[tuple[int, ...]] = []
    granted = asyncio.create_task(_acquire_and_record(sem, (1,), order))
    next_ = asyncio.create_task(_acquire_and_record(sem, (2,), order))
    await until(lambda: sem.waiting == 2)
    sem.release()  # grants the permit to `granted`...
    granted.cancel()  # ...which is cancelled before it can run
    with pytest.raises(asyncio.CancelledError):
        await granted
    await next_
    assert order == [(2,)]
    assert sem.in_use == 1  # the permit was handed on, not lost and not duplicated
    sem.release()
    assert sem.in_use == 0 and sem.waiting == 0


async def test_a_permit_granted_to_the_last_waiter_cancelled_in_the_same_tick_is_freed() -> None:
    sem = PrioritySemaphore(1)
    await sem.acquire((0,))
    granted = asyncio.create_task(sem.acquire((1,)))
    await until(lambda: sem.waiting == 1)
    sem.release()
    granted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted
    assert sem.in_use == 0
    await asyncio.wait_for(sem.acquire((9,)), timeout=5)  # a free permit: no waiting
    assert sem.in_use == 1


async def test_the_slot_context_releases_on_error_and_on_cancellation() -> None:
    sem = PrioritySemaphore(1)
    with pytest.raises(RuntimeError):
        async with sem.slot((0,)):
            raise RuntimeError("boom")
    assert sem.in_use == 0

    entered = asyncio.Event()

    async def hold() -> None:
        async with sem.slot((0,)):
            entered.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold())
    await entered.wait()
    queued = asyncio.create_task(sem.acquire((1,)))
    await until(lambda: sem.waiting == 1)
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    await queued  # the holder's permit went to the queued waiter
    assert sem.in_use == 1
    sem.release()
    assert sem.in_use == 0
