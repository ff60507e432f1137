"""How an ended cohort's outcome reaches the waiters this process holds.

Waiters stay in the process that holds the call. The process whose commit ended a
cohort hands the outcome to its own waiters at once (:meth:`Outcomes.end_here`); every
other process hears the cohort's key on the group store's channel (:meth:`on_ended`)
and reads the outcome from the store (:meth:`fetch`), in batches, by one task. A
message lost while this process was not subscribed costs nothing: after it
(re)subscribes it reads every outcome its waiters need (:meth:`resubscribed`). Keys of
cohorts that ended lately are remembered, so that a member decided while its cohort's
end was published still gets the outcome (:meth:`ended_lately`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from genrm_grpc.cohort.clock import Clock
from genrm_grpc.cohort.model import CohortKey, Outcome
from genrm_grpc.runtime.clock import sleep
from genrm_grpc.runtime.group_store import GroupStore
from genrm_grpc.runtime.judging import Judging
from genrm_grpc.runtime.leased import LeasedEvaluations
from genrm_grpc.runtime.live import deliver
from genrm_grpc.runtime.replica_sweeps import SWEEP_S
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)

#: Keys of cohorts that ended recently, to catch an end published during a decision.
RECENT_ENDS = 4096


class Outcomes:
    """The outcomes this process's waiters wait for (module doc)."""

    def __init__(
        self,
        shared: GroupStore,
        judging: Judging,
        evaluations: LeasedEvaluations,
        *,
        clock: Clock,
        stopping: asyncio.Event,
    ) -> None:
        self._shared = shared
        self._judging = judging
        self._live = judging.live
        self._evaluations = evaluations
        self._clock = clock
        self._stopping = stopping
        self._recent: OrderedDict[CohortKey, None] = OrderedDict()
        self._to_fetch: set[CohortKey] = set()
        self._fetcher: asyncio.Task[None] | None = None

    def end_here(self, key: CohortKey, finished_at: float, outcome: Outcome) -> None:
        """Hand an ended cohort's outcome to this process's waiters; stop its work here."""
        self.ended_recently(key)
        live = self._live.get(key)
        if live is None:
            return
        if finished_at < live.cohort.created_at:
            return  # an earlier cohort under the same (legacy) key
        deliver(self._judging.retire(key) or [], outcome)

    def on_ended(self, key: CohortKey) -> None:
        """The channel says ``key`` ended (committed by some process)."""
        self.ended_recently(key)
        if key in self._live:
            self.fetch(key)

    def ended_recently(self, key: CohortKey) -> None:
        self._recent[key] = None
        if len(self._recent) > RECENT_ENDS:
            self._recent.popitem(last=False)

    def ended_lately(self, key: CohortKey) -> bool:
        return key in self._recent

    async def resubscribed(self) -> None:
        """Messages published while this process was not subscribed are gone: read every
        outcome it waits for, and forget cohorts nobody here waits for any more."""
        for key, live in list(self._live.items()):
            if not live.waiters and key not in self._evaluations.here:
                del self._live[key]
            else:
                self.fetch(key)
        self._evaluations.regrow_all()  # a collecting cohort judged here re-reads its group

    def fetch(self, key: CohortKey) -> None:
        """Read ``key``'s outcome from the store (with the others asked for meanwhile)."""
        self._to_fetch.add(key)
        if self._fetcher is None or self._fetcher.done():
            self._fetcher = self._judging.own(self._fetch_all(), name="replica-outcomes")

    async def _fetch_all(self) -> None:
        while self._to_fetch and not self._stopping.is_set():
            keys, self._to_fetch = self._to_fetch, set()
            try:
                found = await self._shared.outcomes(keys)
            except StoreError as exc:
                log.warning("could not read outcomes (%s); trying again", exc)
                self._to_fetch |= keys
                await sleep(self._clock, SWEEP_S)
                continue
            for key, tomb in found.items():
                self.end_here(key, tomb.finished_at, tomb.outcome)
