"""The single-process runtime: decides on this process's registry, executes at once.

Every registry call happens on the event loop thread with no ``await`` between deciding
and acting, so each decision is atomic. Executing one: the collection and evaluation
timers, the store write of its records (``runtime/writes.py``: one batch per loop
turn), and publication to every waiter at once when that write succeeded. The waiters,
judge passes and tasks of live cohorts are ``runtime/judging.py``'s, shared with the
replicas' runtime (``runtime/replica.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping, Sequence

from genrm_grpc.cohort import events
from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    Phase,
    PromptSpec,
    Reason,
    Submission,
)
from genrm_grpc.cohort.records import CohortRecord, MemberRecord, Record
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, Ended, SubmitDecision
from genrm_grpc.observability.hooks import NullRuntimeObserver, RuntimeObserver
from genrm_grpc.runtime.clock import Clock, LoopClock
from genrm_grpc.runtime.judging import Judging
from genrm_grpc.runtime.live import (
    REWRITE_DELAY_S,
    CallInterrupted,
    Census,
    JudgeBackend,
    Live,
    ProgressCallback,
    RuntimeView,
    Ticket,
    deliver,
    interrupt,
    log_outcome,
    store_unavailable,
)
from genrm_grpc.runtime.writes import WriteQueue
from genrm_grpc.store.durable import DurableStore, MemoryDurable
from genrm_grpc.store.records import StoreError, copy_result

log = logging.getLogger(__name__)


class CohortRuntime:
    def __init__(
        self,
        registry: CohortRegistry,
        judge: JudgeBackend,
        config: RuntimeView,
        *,
        clock: Clock | None = None,
        observer: RuntimeObserver | None = None,
        store: DurableStore | None = None,
        judge_identity: Mapping[str, object] | None = None,
    ) -> None:
        """``store`` is where decisions are made durable (default: ``memory://``, nothing
        survives the process); ``judge_identity`` names the judge settings that can change
        a verdict (model, sampling, budget), part of every journaled pass's context."""
        self.registry = registry
        self._observer: RuntimeObserver = observer or NullRuntimeObserver()
        self.config = config
        self._clock: Clock = clock or LoopClock()
        self.store: DurableStore = store if store is not None else MemoryDurable()
        self.judging = Judging(
            judge,
            config,
            verdicts=self.store,
            journal=self._journal,
            wall=lambda: self._clock.now() + registry.wall_offset,
            judge_identity=judge_identity,
        )
        # Wall clock minus the runtime clock: records carry wall-clock instants.
        registry.wall_offset = time.time() - self._clock.now()
        # Active cohorts' records are written only where a restart can read them back.
        registry.journal_active = self.store.survives_restart
        self._writes = WriteQueue(self.store, self._mark_unwritten)
        # Ended cohorts whose final records are not confirmed durable yet.
        self._unsettled: dict[CohortKey, asyncio.Future[None]] = {}
        self._closed = False
        self._live = self.judging.live

    # ------------------------------------------------------------------ API
    def now(self) -> float:
        return self._clock.now()

    async def open(self) -> int:
        """Read back what the store holds and carry on with it; returns the active cohorts.

        Collecting cohorts get their collection timer (time spent down counts);
        evaluating cohorts resume at once and judge only the passes the journal lacks.
        Raises :class:`StoreSchemaError` for a store this server cannot use.
        """
        recovered = await self.store.open(time.time())
        now = self._clock.now()
        cohorts = self.registry.restore(recovered, now)
        self.judging.resume.extend(recovered.verdicts)
        for cohort in cohorts:
            live = Live(cohort=cohort, durable_slots=set(cohort.members))
            self._live[cohort.key] = live
            self._observer.cohort_started(cohort.key)
            if cohort.phase is Phase.EVALUATING:
                self._start_evaluation(live)
            else:
                live.collection_timer = self._clock.call_at(
                    cohort.collection_deadline,
                    functools.partial(self._on_collection_deadline, live),
                )
        if cohorts or recovered.tombstones:
            log.info(
                "store recovered",
                extra={
                    "active_cohorts": len(cohorts),
                    "tombstones": len(recovered.tombstones),
                    "journaled_passes": len(recovered.verdicts),
                },
            )
        return len(cohorts)

    def decide(self, sub: Submission, *, on_progress: ProgressCallback | None = None) -> Ticket:
        """Apply one member submission on this process's registry, at once: the decision
        is atomic because nothing in it awaits."""
        decision = events.apply(self.registry, events.MemberArrived(sub), self._clock.now())
        assert isinstance(decision, SubmitDecision)
        write = self._writes.persist(decision.records)
        for ended in decision.ended:
            self._publish(ended, write)
        return self._execute(sub, decision, write, on_progress)

    async def submit(
        self, sub: Submission, *, on_progress: ProgressCallback | None = None
    ) -> Ticket:
        """One member's decision (:meth:`decide`): the call every runtime answers, which
        on a replica reads its group from the shared store first."""
        return self.decide(sub, on_progress=on_progress)

    async def view(self, key: CohortKey) -> tuple[CohortRegistry, float]:
        """A registry that answers queries about ``key``'s group, and its ``now``."""
        return self.registry, self._clock.now()

    async def cancel_cohort(self, key: CohortKey, reason: str) -> bool:
        """Fail an active cohort now (operator action); its judge tasks are cancelled.

        False when ``key`` names no active cohort. Every waiter gets ``COHORT_FAILED``
        with ``reason``, and so does a later member of the same attempt.
        """
        live = self._live.get(key)
        if live is None:
            return False
        return self._conclude(self._decide(events.Cancelled(key, live.cohort.seq, reason)))

    @property
    def draining(self) -> bool:
        return self.registry.draining

    def passes_taken(self, key: CohortKey) -> tuple[int, int]:
        return self.judging.passes_taken(key)

    def judge_progress(self, key: CohortKey) -> tuple[int, int]:
        return self.judging.judge_progress(key)

    @property
    def judge_calls(self) -> int:
        return self.judging.judge_calls

    async def compare(self, prompt: PromptSpec, candidates: Sequence[CandidateSpec]) -> Completed:
        """:meth:`Judging.compare`: a batch judged at once, no cohort (shares the bound)."""
        return await self.judging.compare(prompt, candidates, self._clock.now())

    def end_grace(self) -> None:
        """End the shutdown grace period now: running evaluations fail like at its expiry."""
        self.judging.end_grace()

    async def drain_tasks(self) -> None:
        """Await every owned task that is finishing (after a cancel) or still running."""
        await self.judging.drain_tasks()

    # ------------------------------------------------------------------ durability
    def _mark_unwritten(self, records: list[Record]) -> None:
        """After a failed write: the active cohorts whose header or members were in it."""
        for record in records:
            if isinstance(record, MemberRecord | CohortRecord):
                live = self._live.get(record.key)
                if live is not None:
                    live.unwritten = True

    async def flush(self) -> None:
        """Wait until every record queued so far is written (or failed)."""
        await self._writes.flush()

    def _decide(self, event: events.GroupEvent) -> Ended | None:
        """The registry's decision on an event about a cohort (a member's: ``decide``)."""
        decided = events.apply(self.registry, event, self._clock.now())
        assert not isinstance(decided, SubmitDecision)
        return None if isinstance(decided, events.NotActive) else decided

    def _conclude(self, ended: Ended | None) -> bool:
        """Persist an event's records and publish the cohorts it ended once they are durable."""
        if not ended:
            return False
        write = self._writes.persist(ended.records)
        for cohort in ended:
            self._publish(cohort, write)
        return True

    async def shutdown(self, grace_s: float) -> None:
        """Drain: refuse new cohorts, let evaluations finish within ``grace_s``, fail the rest.

        :meth:`end_grace` (a second signal) ends the grace period at once.
        """
        self.registry.start_draining()
        await self.judging.grace(grace_s)
        if self.store.survives_restart:
            # The store keeps every active cohort: the next process resumes them.
            for cohort in self.registry.suspend_all():
                self._suspend(cohort)
        else:
            self._conclude(self.registry.fail_all("server is shutting down", self._clock.now()))
        # What is still running belongs to no cohort (Compare's judge calls): cancel it,
        # or draining would wait up to judge_request_timeout_s.
        self.judging.cancel_all()
        await self.drain_tasks()
        await self.flush()

    async def close(self) -> None:
        """Close the store (after :meth:`shutdown`); idempotent."""
        if not self._closed:
            self._closed = True
            await self.flush()
            await self.store.close()

    def stats(self) -> dict[str, int]:
        return {
            "active_cohorts": self.registry.active_count(),
            **self.judging.stats(),
            "store_failures": self._writes.failures,
        }

    def census(self) -> Census:
        """This process's counts, kept as cohorts come and go (no walk over them)."""
        counts = self.registry.counts()
        evaluating = self.registry.evaluating_count()
        return Census(
            collecting=counts["active"] - evaluating,
            evaluating=evaluating,
            tombstones=counts.get("tombstones", 0),
            watermarks=counts.get("watermarks", 0),
        )

    async def refresh_census(self) -> Census:
        """:meth:`census`, read now: the same call as a replica's, which reads Redis."""
        return self.census()

    # ------------------------------------------------------------------ decisions
    def _execute(
        self,
        sub: Submission,
        decision: SubmitDecision,
        write: asyncio.Future[None] | None,
        on_progress: ProgressCallback | None,
    ) -> Ticket:
        ticket = Ticket(decision.disposition, durable=write)
        if decision.disposition is Disposition.REJECTED:
            ticket.rejection = decision.rejection
            return ticket
        if decision.disposition is Disposition.REPLAYED:
            ticket.replay = decision.replay
            # An outcome whose records are still being written is not replayed before;
            # a replay does not wait for anything else (this submission's own records
            # are only retention's drops).
            ticket.durable = self._unsettled.get(sub.key)
            return ticket
        cohort = decision.cohort
        assert cohort is not None
        live, ticket.waiter, created = self.judging.attach(cohort, sub.rollout_index, on_progress)
        if created:
            if not decision.frozen:  # (a cohort full at its first member needs no timer)
                live.collection_timer = self._clock.call_at(
                    cohort.collection_deadline, lambda: self._on_collection_deadline(live)
                )
            self._observer.cohort_started(cohort.key)
        elif live.unwritten:
            # A member (or the cohort's header) may be missing from the store after a
            # failed write: write the cohort's records again, in this member's batch; a
            # resend, or the next member, waits for that write.
            live.unwritten = False
            ticket.durable = self._writes.persist(self.registry.active_records(cohort))
        elif ticket.durable is None and decision.disposition is Disposition.ATTACHED:
            # The member's own write may still be queued or running.
            ticket.durable = self._writes.latest()
        if decision.disposition is Disposition.ACCEPTED:
            # Judging starts only from what a restart would see: once the member's
            # record is in the store (and so after its "accepted", which waits for the
            # same write).
            if decision.frozen:
                self._start_evaluation(live, ticket.durable)
            else:
                self._when_member_durable(live, sub.rollout_index, ticket.durable)
        return ticket

    def _when_member_durable(
        self, live: Live, slot: int, durable: asyncio.Future[None] | None
    ) -> None:
        """Note ``slot`` as stored once ``durable`` succeeds; eager: start its passes."""

        def stored(done: asyncio.Future[None] | None) -> None:
            if done is not None and (done.cancelled() or done.exception() is not None):
                return  # a resend writes it again (live.unwritten); the freeze waits too
            if self._live.get(live.cohort.key) is not live:
                return
            live.durable_slots.add(slot)
            if self.config.judge_schedule == "eager":
                self.judging.start_ready_pairs(live, slot)

        if durable is None or durable.done():
            stored(durable)
        else:
            durable.add_done_callback(stored)

    def _start_evaluation(self, live: Live, durable: asyncio.Future[None] | None = None) -> None:
        """Judge a frozen cohort, once ``durable`` (the write that froze it) succeeded.

        The evaluation deadline runs from the freeze and the evaluation counts as
        running (shutdown's grace waits for it) while the write is outstanding; a failed
        write is retried every ``REWRITE_DELAY_S`` with the cohort's records.
        """
        cohort = live.cohort
        if live.collection_timer is not None:
            live.collection_timer.cancel()
            live.collection_timer = None
        if not self.judging.plan.pass_count(cohort.group_size):
            # Nothing to judge (a 1-member group): no task, no timer, scored right now.
            try:
                ended = self._decide(self.judging.scored_event(live, []))
            except Exception as exc:  # as in _evaluate: a bug fails the cohort
                ended = self._evaluation_failed(cohort, exc)
            self._conclude(ended)
            return
        assert cohort.evaluation_deadline is not None
        live.evaluation_timer = self._clock.call_at(
            cohort.evaluation_deadline, lambda: self._on_evaluation_deadline(live)
        )
        self.judging.evaluation_started()
        if durable is None or durable.done():
            self._evaluate_when_durable(live, durable)
        else:
            durable.add_done_callback(functools.partial(self._evaluate_when_durable, live))

    def _evaluate_when_durable(self, live: Live, durable: asyncio.Future[None] | None) -> None:
        cohort = live.cohort
        if self._live.get(cohort.key) is not live:
            self.judging.evaluation_ended()  # it ended (deadline, cancel, shutdown) meanwhile
            return
        if durable is not None and (durable.cancelled() or durable.exception() is not None):
            if self._closed:
                self.judging.evaluation_ended()
                return

            def again() -> None:
                if self._live.get(cohort.key) is not live:
                    self.judging.evaluation_ended()
                    return
                write = self._writes.persist(self.registry.active_records(cohort))
                if write is None or write.done():
                    self._evaluate_when_durable(live, write)
                else:
                    write.add_done_callback(functools.partial(self._evaluate_when_durable, live))

            # The runtime's clock, so that tests drive the retries by hand.
            self._clock.call_at(self._clock.now() + REWRITE_DELAY_S, again)
            return
        live.durable_slots.update(cohort.members)
        live.eval_task = self.judging.own(self._evaluate(live), name=f"evaluate {cohort.key}")
        # A done callback, not a finally: a task cancelled before its first step never
        # runs its body.
        live.eval_task.add_done_callback(lambda _: self.judging.evaluation_ended())

    def _journal(self, live: Live, records: list[Record]) -> None:
        """Journal a finished pass (the durable store's batch of this loop turn)."""
        self._writes.persist(records)

    async def _evaluate(self, live: Live) -> None:
        try:
            self._conclude(self._decide(await self.judging.verdict_event(live)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._conclude(self._evaluation_failed(live.cohort, exc))

    def _evaluation_failed(self, cohort: Cohort, exc: Exception) -> Ended | None:
        """A bug, not the judge (that is masked): the cohort fails."""
        log.exception("evaluation of cohort %s failed", cohort.key)
        return self._decide(events.Cancelled(cohort.key, cohort.seq, f"evaluation failed: {exc}"))

    # ------------------------------------------------------------------ timers
    def _on_collection_deadline(self, live: Live) -> None:
        live.collection_timer = None
        self._conclude(self._decide(events.DeadlinePassed(live.cohort.key, live.cohort.seq)))

    def _on_evaluation_deadline(self, live: Live) -> None:
        live.evaluation_timer = None
        self._conclude(self._decide(events.DeadlinePassed(live.cohort.key, live.cohort.seq)))

    # ------------------------------------------------------------------ publication
    def _publish(self, cohort: Cohort, write: asyncio.Future[None] | None) -> None:
        """Hand a terminal cohort's outcome to all its waiters at once, once it is durable.

        ``write`` is the store write of the records that ended it: until it succeeds the
        outcome is neither delivered nor replayed; if it fails, the waiters get
        STORE_UNAVAILABLE and the records are written again until they are stored.
        """
        waiters = self.judging.retire(cohort.key, cohort)
        if waiters is None:
            return
        outcome = cohort.outcome
        assert outcome is not None and cohort.phase in (Phase.COMPLETED, Phase.FAILED)
        age_s = self._clock.now() - cohort.created_at
        log_outcome(self._observer, cohort, outcome, len(waiters), age_s)
        if write is None or (write.done() and write.exception() is None):
            deliver(waiters, outcome)
            return
        key = cohort.key
        self._unsettled[key] = write

        def settled(done: asyncio.Future[None]) -> None:
            error = done.exception() if not done.cancelled() else StoreError("cancelled")
            if error is None:
                if self._unsettled.get(key) is done:
                    del self._unsettled[key]
                deliver(waiters, outcome)
                return
            interrupt(waiters, store_unavailable(f"the outcome of cohort {key}", error))
            self._rewrite(cohort, key)

        write.add_done_callback(settled)

    def _rewrite(self, cohort: Cohort, key: CohortKey) -> None:
        """Write an ended cohort's final records again (after a failed write)."""
        if self._closed:
            return
        records = self.registry.final_records(cohort)
        loop = asyncio.get_running_loop()
        retry: asyncio.Future[None] = loop.create_future()
        self._unsettled[key] = retry

        def again() -> None:
            write = self._writes.persist(records)
            if write is None:
                retry.set_result(None)
                return
            write.add_done_callback(lambda done: copy_result(done, retry))

        def settled(done: asyncio.Future[None]) -> None:
            if done.exception() is None:
                if self._unsettled.get(key) is done:
                    del self._unsettled[key]
            else:
                self._rewrite(cohort, key)

        retry.add_done_callback(settled)
        # The runtime's clock, so that tests drive the retries by hand.
        self._clock.call_at(self._clock.now() + REWRITE_DELAY_S, again)

    def _suspend(self, cohort: Cohort) -> None:
        """The server stops; the cohort stays in the store for the next process."""
        waiters = self.judging.retire(cohort.key, cohort) or []
        interrupted = CallInterrupted(
            Reason.SHUTTING_DOWN,
            f"the server is restarting; cohort {cohort.key} is kept in its store and resumes "
            "when it is back: resend the identical member to reattach",
        )
        interrupt(waiters, interrupted)
