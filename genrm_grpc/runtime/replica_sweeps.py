"""What a replica looks for in the background, in its clock's time: due deadlines and
orphaned evaluations (``runtime/replica.py``, "Deadlines").

On Redis every replica polls the deadline index every ``SWEEP_S`` (any replica may
have filed a deadline), and the version check lets exactly one of them end the cohort.
The in-process store times its deadlines itself (``GroupStore.watch_due``): its timer
says when a key is due, and the sweep does not poll for them. Either way the decision
(``DeadlinePassed``) checks the deadline again in the registry, so a key reported due
that is not (any more) costs one decision that changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from genrm_grpc.cohort.clock import Clock
from genrm_grpc.cohort.events import DeadlinePassed, NotActive
from genrm_grpc.cohort.model import CohortKey
from genrm_grpc.runtime.clock import sleep
from genrm_grpc.runtime.group_decisions import GroupDecisions, Owner
from genrm_grpc.runtime.group_store import GroupStore
from genrm_grpc.runtime.leased import LeasedEvaluations
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)
#: Jitter from a generator of its own, not the ``random`` module's shared one: a
#: process that seeds ``random`` for a reproducible run draws the same numbers
#: whether or not a sweep ran.
_JITTER = random.Random()

#: How often each replica looks for due deadlines and orphaned evaluations.
SWEEP_S = 0.25
#: How often a replica re-reads the outcomes its waiters wait for, whatever the channel
#: said: the channel is at-most-once, this bounds how long a lost message can delay one.
RECHECK_S = 5.0


class Sweeps:
    def __init__(
        self,
        shared: GroupStore,
        decisions: GroupDecisions,
        evaluations: LeasedEvaluations,
        *,
        clock: Clock,
        own: Owner,
        stopping: asyncio.Event,
        draining: Callable[[], bool],
        recheck: Callable[[], Awaitable[None]],
        store_failed: Callable[[], None],
    ) -> None:
        """``recheck`` re-reads what the replica's waiters wait for (every
        ``RECHECK_S``); ``store_failed`` tells the runtime the store did not answer."""
        self.shared = shared
        self.decisions = decisions
        self.evaluations = evaluations
        self._clock = clock
        self._own = own
        self._stopping = stopping
        self._draining = draining
        self._recheck = recheck
        self._store_failed = store_failed
        #: Stops the store's deadline timers (None: the sweep polls the store's index).
        self._unwatch: Callable[[], None] | None = None

    def watch(self) -> None:
        """Before the store is opened: its deadline timers, if it has them."""
        self._unwatch = self.shared.watch_due(self.on_due)

    def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()

    async def sweep(self) -> None:
        clock = self._clock
        recheck = clock.now() + RECHECK_S
        while not self._stopping.is_set():
            await sleep(clock, SWEEP_S * _JITTER.uniform(0.8, 1.2))
            if clock.now() >= recheck:
                recheck = clock.now() + RECHECK_S
                await self._recheck()
            try:
                if self._unwatch is None:  # Redis: deadlines are polled
                    due = await self.shared.due(clock.now())
                    await asyncio.gather(*(self.deadline(key) for key in due))
                if self._draining():
                    continue
                for key in await self.shared.orphaned(clock.now()):
                    if key in self.evaluations.here:
                        continue
                    lease = await self.shared.claim(key)
                    if lease is not None:
                        log.info("took over the evaluation of %s", key)
                        self.evaluations.start(key, lease)
            except StoreError as exc:
                self._store_failed()
                log.debug("sweep failed: %s", exc)

    async def deadline(self, key: CohortKey) -> None:
        if isinstance(await self.decisions.apply(key, DeadlinePassed(key)), NotActive):
            await self.shared.forget(key)

    def on_due(self, key: CohortKey) -> None:
        """The store's timer says ``key``'s deadline is due: decide it now."""
        if not self._stopping.is_set():
            self._own(self._deadline_due(key), name=f"deadline {key}")

    async def _deadline_due(self, key: CohortKey) -> None:
        try:
            await self.deadline(key)
        except StoreError as exc:  # still due: asked again after SWEEP_S
            self._store_failed()
            log.debug("deadline of %s not decided: %s", key, exc)
            self._clock.call_at(self._clock.now() + SWEEP_S, lambda: self.on_due(key))
