"""Cohorts a replica judges under their evaluation lease (docs/scaling.md).

The replica whose commit froze a cohort (or, eager, created it) holds its evaluation
lease and renews it every ``replica_lease_s``/3; its journal writes and its final
commit are fenced by that lease. Eager judging starts the passes between the members
stored so far and starts more each time the channel says the group grew. A lease lost
(the replica paused or lost Redis) stops the evaluation here; whoever claims it next
reads the cohort and its journal and judges only the passes the journal lacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from genrm_grpc.cohort.clock import Clock
from genrm_grpc.cohort.events import Cancelled, GroupEvent
from genrm_grpc.cohort.model import CohortKey, Phase
from genrm_grpc.cohort.phases import Event as PhaseEvent
from genrm_grpc.cohort.phases import allows
from genrm_grpc.cohort.records import Record, Recovered, RecoveredCohort, VerdictRecord
from genrm_grpc.runtime.clock import sleep
from genrm_grpc.runtime.group_decisions import GroupDecisions
from genrm_grpc.runtime.group_store import GroupStore
from genrm_grpc.runtime.judging import Judging
from genrm_grpc.runtime.live import REWRITE_DELAY_S, Live, RuntimeView
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)


class LeasedEvaluations:
    def __init__(
        self,
        shared: GroupStore,
        config: RuntimeView,
        judging: Judging,
        decisions: GroupDecisions,
        *,
        hand_off: Callable[[CohortKey, Lease], Awaitable[None]],
        store_failed: Callable[[], None],
        clock: Clock,
    ) -> None:
        """``hand_off`` releases a lease for another replica to claim; ``store_failed``
        tells the runtime Redis did not answer; ``clock`` times the renewals and the
        retries (a lease's validity is the store's: ``GroupStore.lease_now``)."""
        self.shared = shared
        self._clock = clock
        self.config = config
        self.judging = judging
        self.decisions = decisions
        self._hand_off = hand_off
        self._store_failed = store_failed
        #: Keys of the cohorts judged here now.
        self.here: set[CohortKey] = set()
        #: Collecting cohorts judged here eagerly: set when the channel says one grew.
        self._growth: dict[CohortKey, asyncio.Event] = {}

    def grown(self, key: CohortKey) -> None:
        """The channel says ``key``'s group grew: an eager evaluation re-reads it."""
        grew = self._growth.get(key)
        if grew is not None:
            grew.set()

    def regrow_all(self) -> None:
        """After a resubscription (messages may be lost): every eager one re-reads."""
        for grew in self._growth.values():
            grew.set()

    def start(self, key: CohortKey, lease: Lease) -> None:
        """Judge ``key`` here under ``lease`` (nothing when it already is)."""
        if key in self.here:
            return
        self.here.add(key)
        self.judging.evaluation_started()
        task = self.judging.own(self._evaluation(key, lease), name=f"evaluate {key}")

        def done(_: asyncio.Task[None]) -> None:
            self.here.discard(key)
            self.judging.evaluation_ended()

        task.add_done_callback(done)

    def _adopt(self, key: CohortKey, entry: RecoveredCohort) -> Live:
        """This replica's live state of ``key`` as ``entry`` holds it, judged from here."""
        (cohort,) = self.decisions.group_registry().restore(
            Recovered(cohorts=(entry,)), self._clock.now()
        )
        live = self.judging.live.get(key)
        if live is None:
            live = Live(cohort=cohort)
            self.judging.live[key] = live
        else:
            live.cohort = cohort
        live.eval_task = asyncio.current_task()
        return live

    async def _collect_eagerly(
        self,
        key: CohortKey,
        live: Live,
        entry: RecoveredCohort | None,
        verdicts: list[VerdictRecord],
    ) -> tuple[RecoveredCohort | None, list[VerdictRecord]]:
        """Eager judging: start the passes between the stored members of a collecting
        cohort, again each time the channel says it grew, until it froze or ended;
        returns the group as last read."""
        grew = self._growth.setdefault(key, asyncio.Event())
        try:
            while entry is not None and entry.header.phase is Phase.COLLECTING:
                self.judging.resume.extend(verdicts)
                live = self._adopt(key, entry)
                for slot in sorted(live.cohort.members):
                    if slot not in live.durable_slots:  # stored: a restart would see it
                        live.durable_slots.add(slot)
                        self.judging.start_ready_pairs(live, slot)
                await grew.wait()
                grew.clear()
                entry, verdicts = await self.shared.load_evaluation(key)
        finally:
            self._growth.pop(key, None)
        return entry, verdicts

    async def _evaluation(self, key: CohortKey, lease: Lease) -> None:
        keeper: asyncio.Task[None] | None = None
        try:
            entry, verdicts = await self.shared.load_evaluation(key)
            eager = self.config.judge_schedule == "eager"
            if eager and entry is not None and entry.header.phase is Phase.COLLECTING:
                live = self._adopt(key, entry)
                keeper = self._hold(live, key, lease)
                entry, verdicts = await self._collect_eagerly(key, live, entry, verdicts)
            if entry is None or entry.header.phase is not Phase.EVALUATING:
                await self._hand_off(key, lease)
                if entry is None:
                    await self.shared.forget(key)
                return
            live = self._adopt(key, entry)
            if not allows(live.cohort.phase, PhaseEvent.JUDGED):
                return
            if keeper is None:
                keeper = self._hold(live, key, lease)
            self.judging.resume.extend(verdicts)
            event = await self.judging.verdict_event(live)
            # The verdicts first, then the outcome: a commit that ends the cohort drops
            # its lease, and a journal write arriving after it would be refused (and a
            # later attempt of the group could not reuse that verdict).
            await asyncio.gather(*live.journal_writes, return_exceptions=True)
            live.journal_writes.clear()
            await self._conclude(key, live, event, lease)
        except StoreError as exc:
            self._store_failed()
            log.warning("evaluation of %s stopped: %s; another replica takes it over", key, exc)
        except Exception as exc:
            # A bug, not the judge (that is JudgeFailedError, masked above): the cohort
            # fails as in a single process, rather than being taken over to fail again.
            log.exception("evaluation of cohort %s failed", key)
            await self._fail_evaluation(key, f"evaluation failed: {exc}", lease)
        finally:
            if keeper is not None:
                keeper.cancel()
            self.judging.resume.drop(key)

    async def _conclude(self, key: CohortKey, live: Live, event: GroupEvent, lease: Lease) -> None:
        """Commit the event that ends the evaluation. A store that fails is tried again
        every ``REWRITE_DELAY_S`` for as long as the lease is this replica's (it is
        renewed meanwhile); after that the lease's next holder finishes the cohort."""
        while True:
            current = live.lease if isinstance(live.lease, Lease) else lease
            try:
                if not await self.decisions.decide_one(key, event, current):
                    log.warning("evaluation of %s was taken over; its result is dropped", key)
                return
            except StoreError as exc:
                self._store_failed()
                if self.shared.lease_now() + REWRITE_DELAY_S >= current.valid_until:
                    raise
                log.warning("could not commit the end of %s (%s); trying again", key, exc)
            await sleep(self._clock, REWRITE_DELAY_S)

    def _hold(self, live: Live, key: CohortKey, lease: Lease) -> asyncio.Task[None]:
        """Judge ``key`` under ``lease`` from here, renewing it until the task is cancelled."""
        live.lease = lease
        return self.judging.own(self._keep_lease(live, key), name=f"lease {key}")

    async def _fail_evaluation(self, key: CohortKey, reason: str, lease: Lease) -> None:
        live = self.judging.live.get(key)
        seq = live.cohort.seq if live is not None else None
        current = live.lease if live is not None and isinstance(live.lease, Lease) else lease
        try:
            await self.decisions.decide_one(key, Cancelled(key, seq, reason), current)
        except StoreError as exc:
            log.warning("could not record the failure of %s (%s); its lease expires", key, exc)

    async def _keep_lease(self, live: Live, key: CohortKey) -> None:
        """Renew the evaluation lease every third of its life; stop the evaluation if lost."""
        period = self.shared.lease_s / 3
        while True:
            await sleep(self._clock, period)
            lease = live.lease
            if not isinstance(lease, Lease):
                return
            try:
                renewed = await self.shared.renew(key, lease)
            except StoreError:
                self._store_failed()
                if self.shared.lease_now() < lease.valid_until:
                    continue
                renewed = None
            if renewed is None:
                log.warning("lost the evaluation lease of %s; another replica takes over", key)
                live.lease = None
                task = live.eval_task
                if task is not None and not task.done():
                    task.cancel()
                for pair in live.pair_tasks.values():
                    pair.cancel()
                live.pair_tasks.clear()
                return
            live.lease = renewed

    def journal(self, live: Live, records: list[Record]) -> None:
        """Write a finished pass fenced by the lease it is judged under."""
        lease = live.lease
        if not isinstance(lease, Lease):
            return  # the lease is gone: whoever took over journals its own passes
        written = self.shared.store.persist(records, lease=lease)
        written.add_done_callback(_journal_written)
        live.journal_writes.append(written)


def _journal_written(written: asyncio.Future[None]) -> None:
    if not written.cancelled() and written.exception() is not None:
        log.warning("a journal write failed: %s", written.exception())
