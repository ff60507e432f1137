"""The asyncio driver of the cohort registry.

It executes the registry's decisions: one waiter per call (many per slot), the
collection and evaluation timers, judge tasks under a priority-ordered concurrency
bound, publication of an outcome to every waiter at once, and the ownership of every
task it creates (cancelled and awaited when a cohort ends early or the server stops).

All registry calls happen on the event loop thread without an ``await`` in between
deciding and acting, so each decision is atomic.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from genrm_grpc.cohort.journal import VerdictJournal, judge_context
from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    Masked,
    Member,
    MemberCoords,
    MemberReward,
    Outcome,
    Phase,
    PromptSpec,
    Reason,
    Submission,
    comparisons_by_member,
    reward_problem,
)
from genrm_grpc.cohort.quota import admits
from genrm_grpc.cohort.records import CohortRecord, MemberRecord, Record, VerdictRecord
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, Ended, SubmitDecision, fill
from genrm_grpc.judge.client import (
    JudgeFailedError,
    JudgeInput,
    JudgeOutcome,
    JudgeProgress,
    TokenUsage,
)
from genrm_grpc.observability.hooks import CohortOutcome, NullRuntimeObserver, RuntimeObserver
from genrm_grpc.runtime.clock import Clock, LoopClock
from genrm_grpc.runtime.live import (
    START_SLICE,
    CallInterrupted,
    Census,
    CompareCapacityError,
    JudgeBackend,
    Live,
    PairProgress,
    PairResult,
    ProgressCallback,
    RuntimeView,
    Ticket,
    Waiter,
    all_or_first_error,
    copy_result,
    deliver,
    interrupt,
    pass_plan,
    retrieve_exception,
    store_unavailable,
    usage_metrics,
)
from genrm_grpc.runtime.plan import Pass
from genrm_grpc.runtime.scheduler import PrioritySemaphore
from genrm_grpc.scoring import aggregate
from genrm_grpc.scoring.types import AnswerTexts, JudgedPair
from genrm_grpc.store.durable import DurableStore, MemoryDurable
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: After a failed write of a cohort's final records, how long until it is tried again.
REWRITE_DELAY_S = 1.0


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
        self._judge = judge
        self._clock: Clock = clock or LoopClock()
        self.store: DurableStore = store if store is not None else MemoryDurable()
        self._judge_identity = dict(judge_identity or {})
        # Wall clock minus the runtime clock: records carry wall-clock instants.
        registry.wall_offset = time.time() - self._clock.now()
        # Active cohorts' records are written only where a restart can read them back.
        registry.journal_active = self.store.survives_restart
        self._pending: list[Record] = []
        self._pending_write: asyncio.Future[None] | None = None
        self._last_write: asyncio.Future[None] | None = None
        # Ended cohorts whose final records are not confirmed durable yet.
        self._unsettled: dict[CohortKey, asyncio.Future[None]] = {}
        self._resume = VerdictJournal(reuse=False)
        self.passes_reused = 0
        self.passes_resumed = 0
        self.store_failures = 0
        self._closed = False
        self._sem = PrioritySemaphore(config.judge_max_concurrency)
        self._plan = pass_plan(config)
        self._live: dict[CohortKey, Live] = {}
        self._owned: set[asyncio.Task[Any]] = set()
        self._ready_seq = 0
        self._compare_passes = 0  # passes of running comparisons (queued or judging)
        self._evaluating = 0
        self._no_evaluations = asyncio.Event()
        self._no_evaluations.set()
        self._grace_over = asyncio.Event()
        self.judge_calls = 0

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
        self._resume.extend(recovered.verdicts)
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
        decision = self.registry.submit(sub, self._clock.now())
        write = self._persist(decision.records)
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
        return self._conclude(self.registry.fail(live.cohort, reason, self._clock.now()))

    @property
    def draining(self) -> bool:
        return self.registry.draining

    def passes_taken(self, key: CohortKey) -> tuple[int, int]:
        """(reused, resumed) journal passes of an active cohort so far."""
        live = self._live.get(key)
        return (0, 0) if live is None else (live.reused, live.resumed)

    def judge_progress(self, key: CohortKey) -> tuple[int, int]:
        """(comparisons at the judge, output tokens they streamed so far) of a cohort
        this process is judging; (0, 0) otherwise. One lookup: the judge client keeps
        the counts up to date as it goes."""
        live = self._live.get(key)
        return (0, 0) if live is None else (live.judge.in_flight, live.judge.tokens)

    # ------------------------------------------------------------------ durability
    def _persist(self, records: list[Record]) -> asyncio.Future[None] | None:
        """Queue ``records``; all queued in one loop iteration go to the store together.

        Returns the future of their write (None when nothing was queued).
        """
        if not records:
            return None
        if not self.store.survives_restart:
            # Nothing to wait for: the records only feed the in-process verdict index.
            written = self.store.persist(records)
            return None if written.done() and written.exception() is None else written
        self._pending.extend(records)
        write = self._pending_write
        if write is None:
            loop = asyncio.get_running_loop()
            write = self._pending_write = loop.create_future()
            loop.call_soon(self._flush)
        return write

    def _flush(self) -> None:
        records, self._pending = self._pending, []
        write, self._pending_write = self._pending_write, None
        if write is None:
            return
        self._last_write = write
        try:
            stored = self.store.persist(records)
        except Exception as exc:  # a store that raises instead of failing its future
            stored = asyncio.get_running_loop().create_future()
            stored.set_exception(StoreError(str(exc)))
        stored.add_done_callback(lambda done: copy_result(done, write))
        write.add_done_callback(self._count_failure)
        write.add_done_callback(functools.partial(self._mark_unwritten, records))

    def _count_failure(self, write: asyncio.Future[None]) -> None:
        if write.cancelled() or write.exception() is not None:
            self.store_failures += 1
            log.error(
                "store write failed: %s", "cancelled" if write.cancelled() else write.exception()
            )

    def _mark_unwritten(self, records: list[Record], write: asyncio.Future[None]) -> None:
        """After a failed write: the active cohorts whose header or members were in it."""
        if not write.cancelled() and write.exception() is None:
            return
        for record in records:
            if isinstance(record, MemberRecord | CohortRecord):
                live = self._live.get(record.key)
                if live is not None:
                    live.unwritten = True

    async def flush(self) -> None:
        """Wait until every record queued so far is written (or failed)."""
        if self._pending_write is not None:
            self._flush()
        if self._last_write is not None:
            await asyncio.gather(self._last_write, return_exceptions=True)

    def _conclude(self, ended: Ended | None) -> bool:
        """Persist an event's records and publish the cohorts it ended once they are durable."""
        if not ended:
            return False
        write = self._persist(ended.records)
        for cohort in ended:
            self._publish(cohort, write)
        return True

    async def compare(self, prompt: PromptSpec, candidates: Sequence[CandidateSpec]) -> Completed:
        """Judge a batch right away (no cohort, no replay); shares the judge bound.

        Raises :class:`JudgeFailedError` when the judge fails, and
        :class:`CompareCapacityError` when its passes would exceed
        ``max_queued_compare_passes`` together with those of running comparisons (a
        comparison alone is always admitted).

        Fair order: pass *p* of a comparison queues for a judge permit as if it were a
        cohort that became ready *p* places later, so cohorts that become ready while a
        large comparison runs are interleaved with its passes (one cohort, then one
        pass) instead of waiting for all of them; comparisons interleave likewise.
        """
        n = len(candidates)
        passes = self._plan.pass_count(n)
        limit = self.config.max_queued_compare_passes
        if not admits(self._compare_passes, passes, limit):
            raise CompareCapacityError(
                f"this comparison needs {passes} judge passes and {self._compare_passes} are "
                f"already queued or running; max_queued_compare_passes={limit}: retry later"
            )
        self._ready_seq += 1
        self._compare_passes += passes
        cohort = Cohort(
            key=CohortKey(group_id=None, legacy_key="compare", attempt=self._ready_seq),
            seq=0,
            group_size=n,
            prompt=prompt,
            prompt_digest="",
            created_at=self._clock.now(),
            collection_deadline=math.inf,
            members={k: Member(MemberCoords(rollout_index=k), c) for k, c in enumerate(candidates)},
        )
        fill(cohort, None)  # every member at once
        live = Live(cohort=cohort, priority=self._ready_seq, spread=True)
        # Counted as an evaluation so that shutdown grants it the same grace.
        self._evaluating += 1
        self._no_evaluations.clear()
        try:
            tasks = [self._start_pair(live, job) for job in self._plan.all_passes(n)]
            try:
                results = await all_or_first_error(tasks)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # our caller went away
                # A judge task was cancelled under us: shutdown after its grace.
                raise JudgeFailedError(
                    "the comparison was cancelled: the server is shutting down"
                ) from None
            scored = self._score(cohort, results)
            problem = reward_problem(scored.rewards, n)
            if problem is not None:
                raise ValueError(problem)
            return scored
        finally:
            self._compare_passes -= passes
            self._evaluation_ended()

    async def shutdown(self, grace_s: float) -> None:
        """Drain: refuse new cohorts, let evaluations finish within ``grace_s``, fail the rest.

        :meth:`end_grace` (a second signal) ends the grace period at once.
        """
        self.registry.start_draining()
        await self._grace(grace_s)
        if self.store.survives_restart:
            # The store keeps every active cohort: the next process resumes them.
            for cohort in self.registry.suspend_all():
                self._suspend(cohort)
        else:
            self._conclude(self.registry.fail_all("server is shutting down", self._clock.now()))
        # What is still running belongs to no cohort (Compare's judge calls): cancel it,
        # or draining would wait up to judge_request_timeout_s.
        for task in list(self._owned):
            task.cancel()
        await self.drain_tasks()
        await self.flush()

    async def _grace(self, grace_s: float) -> None:
        """Wait until no evaluation runs, ``grace_s`` passed, or :meth:`end_grace`."""
        if not self._evaluating or self._grace_over.is_set():
            return
        waits = [
            asyncio.ensure_future(self._no_evaluations.wait()),
            asyncio.ensure_future(self._grace_over.wait()),
        ]
        try:
            done, _ = await asyncio.wait(
                waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        if not done:
            log.warning("shutdown grace of %gs expired with evaluations running", grace_s)
        elif self._evaluating:
            log.warning("shutdown grace cut short with evaluations running")

    async def close(self) -> None:
        """Close the store (after :meth:`shutdown`); idempotent."""
        if not self._closed:
            self._closed = True
            await self.flush()
            await self.store.close()

    def end_grace(self) -> None:
        """End the shutdown grace period now: running evaluations fail like at its expiry."""
        self._grace_over.set()

    async def drain_tasks(self) -> None:
        """Await every owned task that is finishing (after a cancel) or still running."""
        while self._owned:
            await asyncio.gather(*list(self._owned), return_exceptions=True)

    def stats(self) -> dict[str, int]:
        return {
            "live_cohorts": len(self._live),
            "active_cohorts": self.registry.active_count(),
            "waiters": sum(len(w) for live in self._live.values() for w in live.waiters.values()),
            "owned_tasks": len(self._owned),
            "judge_in_flight": self._sem.in_use,
            "judge_waiting": self._sem.waiting,
            "judge_calls": self.judge_calls,
            "compare_passes": self._compare_passes,
            "passes_reused": self.passes_reused,
            "passes_resumed": self.passes_resumed,
            "store_failures": self.store_failures,
        }

    def census(self) -> Census:
        phases = {Phase.COLLECTING: 0, Phase.EVALUATING: 0}
        for cohort in self.registry.active_cohorts():
            if cohort.phase in phases:
                phases[cohort.phase] += 1
        counts = self.registry.counts()
        return Census(
            collecting=phases[Phase.COLLECTING],
            evaluating=phases[Phase.EVALUATING],
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
        live = self._live.get(cohort.key)
        if live is None:
            live = Live(cohort=cohort)
            self._live[cohort.key] = live
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
            ticket.durable = self._persist(self.registry.active_records(cohort))
        elif ticket.durable is None and decision.disposition is Disposition.ATTACHED:
            # The member's own write may still be queued or running.
            ticket.durable = self._pending_write or self._last_write
        waiter = Waiter(live, sub.rollout_index, on_progress)
        live.waiters.setdefault(sub.rollout_index, set()).add(waiter)
        ticket.waiter = waiter
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
                self._start_ready_pairs(live, slot)

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
        if not self._plan.pass_count(cohort.group_size):
            # Nothing to judge (a 1-member group): no task, no timer, scored right now.
            try:
                ended = self._scored(live, [])
            except Exception as exc:  # as in _evaluate: a bug fails the cohort
                log.exception("evaluation of cohort %s failed", cohort.key)
                ended = self.registry.fail(cohort, f"evaluation failed: {exc}", self._clock.now())
            self._conclude(ended)
            return
        assert cohort.evaluation_deadline is not None
        live.evaluation_timer = self._clock.call_at(
            cohort.evaluation_deadline, lambda: self._on_evaluation_deadline(live)
        )
        self._evaluating += 1
        self._no_evaluations.clear()
        if durable is None or durable.done():
            self._evaluate_when_durable(live, durable)
        else:
            durable.add_done_callback(functools.partial(self._evaluate_when_durable, live))

    def _evaluate_when_durable(self, live: Live, durable: asyncio.Future[None] | None) -> None:
        cohort = live.cohort
        if self._live.get(cohort.key) is not live:
            self._evaluation_ended()  # it ended (deadline, cancel, shutdown) meanwhile
            return
        if durable is not None and (durable.cancelled() or durable.exception() is not None):
            if self._closed:
                self._evaluation_ended()
                return

            def again() -> None:
                if self._live.get(cohort.key) is not live:
                    self._evaluation_ended()
                    return
                write = self._persist(self.registry.active_records(cohort))
                if write is None or write.done():
                    self._evaluate_when_durable(live, write)
                else:
                    write.add_done_callback(functools.partial(self._evaluate_when_durable, live))

            # The runtime's clock, so that tests drive the retries by hand.
            self._clock.call_at(self._clock.now() + REWRITE_DELAY_S, again)
            return
        live.durable_slots.update(cohort.members)
        live.eval_task = self._own(self._evaluate(live), name=f"evaluate {cohort.key}")
        # A done callback, not a finally: a task cancelled before its first step never
        # runs its body.
        live.eval_task.add_done_callback(self._evaluation_done)

    def _evaluation_done(self, _task: asyncio.Task[None]) -> None:
        self._evaluation_ended()

    def _evaluation_ended(self) -> None:
        self._evaluating -= 1
        if self._evaluating == 0:
            self._no_evaluations.set()

    def _start_ready_pairs(self, live: Live, arrived: int) -> None:
        """Eager: start the passes of the member that arrived whose partners are present."""
        cohort = live.cohort
        for job in self._plan.passes_with(cohort.group_size, arrived, live.durable_slots):
            if job.order not in live.pair_tasks:
                self._start_pair(live, job)

    def _start_pair(self, live: Live, job: Pass) -> asyncio.Task[PairResult]:
        task = live.pair_tasks.get(job.order)
        if task is None:
            if live.priority is None:
                self._ready_seq += 1
                live.priority = self._ready_seq
            key = live.cohort.key
            journaled = self._resume.resume(key, job.i, job.j, job.judge_index)
            if journaled is not None:
                # Finished before a restart: its journaled verdict, no judge call.
                coro: Coroutine[Any, Any, PairResult] = self._resumed(live, job, journaled)
            else:
                inp = self._judge_input(live.cohort, job, live.judge)
                coro = self._judge_pair(live, job, inp)
            task = self._own(coro, name=f"judge {key} {job}")
            live.pair_tasks[job.order] = task
        return task

    async def _resumed(self, live: Live, job: Pass, record: VerdictRecord) -> PairResult:
        live.resumed += 1
        self.passes_resumed += 1
        usage = None if record.usage is None else TokenUsage(*record.usage)
        pair = JudgedPair(job.i, job.j, job.judge_index, record.verdict)
        return PairResult(pair, usage, "resumed")

    # ------------------------------------------------------------------ tasks
    def _own(self, coro: Coroutine[Any, Any, _T], *, name: str) -> asyncio.Task[_T]:
        task = asyncio.create_task(coro, name=name)
        self._owned.add(task)
        task.add_done_callback(self._owned.discard)
        # An eager pair can fail in a cohort that then never fills (or ends otherwise):
        # nobody awaits it, and its exception must not be logged as never retrieved.
        task.add_done_callback(retrieve_exception)
        return task

    def _judge_input(
        self, cohort: Cohort, job: Pass, progress: JudgeProgress | None = None
    ) -> JudgeInput:
        snapshot = cohort.members
        prompt = cohort.prompt
        first = snapshot[job.i].candidate.texts.judge_text()
        if self.config.comparison_mode == "fixed_baseline":
            second = AnswerTexts("", prompt.baseline_response or "").judge_text()
        else:
            second = snapshot[job.j].candidate.texts.judge_text()
        # An absent or empty principle falls back to default_principle.
        principle = None
        if self.config.use_principle:
            principle = prompt.principle or self.config.default_principle or None
        return JudgeInput(
            prompt.messages,
            first,
            second,
            principle,
            affinity=cohort.prompt_digest,
            progress=progress,
        )

    async def _judge_pair(self, live: Live, job: Pass, inp: JudgeInput) -> PairResult:
        cohort = live.cohort
        assert live.priority is not None
        journal = not live.spread  # a Compare is not a cohort: nothing to journal or reuse
        question = self._question(live, job, inp) if journal else None
        if question is not None and self._may_reuse(cohort):
            reused = await self._reusable(cohort, job, question)
            if reused is not None:
                live.reused += 1
                self.passes_reused += 1
                self._progress(live, job)
                return reused
        # Cohort passes queue by (readiness, pass order); a comparison's pass p by
        # readiness + p, after any cohort of that rank (see ``compare``).
        if live.spread:
            rank: tuple[int, ...] = (live.priority + job.order, 1, job.order)
        else:
            rank = (live.priority, 0, job.order)
        async with self._sem.slot(rank):
            if live.judge_failure is not None:
                # A sibling failed while this pair waited; the permit it freed must not
                # start a judge call whose verdict would be discarded.
                raise JudgeFailedError(live.judge_failure)
            self.judge_calls += 1
            try:
                out = await self._judge.judge(inp, swap=job.swap)
            except JudgeFailedError as exc:
                live.judge_failure = exc.reason
                if cohort.phase is Phase.COLLECTING:
                    # Eager judging: the group can no longer be rewarded, so the other
                    # early comparisons are wasted money. (After collection, the
                    # evaluation's own wait cancels them.)
                    self._cancel_pairs(live, keep=asyncio.current_task())
                raise
        if question is not None:
            # Journaled the moment it finished: a restart resumes without this call.
            self._journal(live, [_verdict_record(cohort.key, job, question, out)])
        self._progress(live, job)
        return PairResult(JudgedPair(job.i, job.j, job.judge_index, out.verdict), out.usage)

    def _journal(self, live: Live, records: list[Record]) -> None:
        """Journal a finished pass (the durable store's batch of this loop turn)."""
        self._persist(records)

    def _progress(self, live: Live, job: Pass) -> None:
        cohort = live.cohort
        if not cohort.active:
            return
        progress = PairProgress(cohort.key, job.i, job.j, job.judge_index)
        callbacks = {
            w.on_progress: None for ws in live.waiters.values() for w in ws if w.on_progress
        }
        for callback in callbacks:
            callback(progress)

    def _question(self, live: Live, job: Pass, inp: JudgeInput) -> tuple[str, str, str]:
        """(context, first, second): what a journaled verdict answers, as digests."""
        cohort = live.cohort
        if live.context is None:
            settings = {
                **self._judge_identity,
                "principle": inp.principle,
                "comparison_mode": self.config.comparison_mode,
            }
            live.context = judge_context(cohort.prompt_digest, settings)
        members = cohort.members
        first = members[job.i].candidate.digest
        if self.config.comparison_mode == "fixed_baseline":
            baseline = (cohort.prompt.baseline_response or "").encode("utf-8", "surrogatepass")
            second = hashlib.sha256(baseline).hexdigest()
        else:
            second = members[job.j].candidate.digest
        return live.context, first, second

    def _may_reuse(self, cohort: Cohort) -> bool:
        # Only a later attempt of an explicit group; legacy keys are always judged again.
        return (
            cohort.follows_attempt and cohort.key.explicit and self.config.verdict_reuse == "group"
        )

    async def _reusable(
        self, cohort: Cohort, job: Pass, question: tuple[str, str, str]
    ) -> PairResult | None:
        scope = cohort.key.group_scope
        assert scope is not None
        context, first, second = question
        try:
            found = await self.store.find_verdict(
                scope, context, first, second, job.judge_index, job.swap
            )
        except StoreError as exc:
            log.warning("verdict journal lookup failed, judging instead: %s", exc)
            return None
        if found is None or found.verdict.parse_failed:
            # A verdict that fell back to the default scores is asked again.
            return None
        return PairResult(JudgedPair(job.i, job.j, job.judge_index, found.verdict), None, "reused")

    def _cancel_pairs(self, live: Live, *, keep: asyncio.Task[Any] | None = None) -> None:
        for task in live.pair_tasks.values():
            if task is not keep and not task.done():
                task.cancel()

    async def _evaluate(self, live: Live) -> None:
        cohort = live.cohort
        try:
            tasks = []
            for job in self._plan.all_passes(cohort.group_size):
                tasks.append(self._start_pair(live, job))
                if len(tasks) % START_SLICE == 0:
                    await asyncio.sleep(0)  # a large cohort: let other work run
            now = self._clock.now
            try:
                results = await all_or_first_error(tasks)
            except JudgeFailedError as exc:
                ended = self.registry.judge_failed(
                    cohort, exc.reason, now(), reused=live.reused, resumed=live.resumed
                )
            else:
                ended = self._scored(live, results)
            self._conclude(ended)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("evaluation of cohort %s failed", cohort.key)
            self._conclude(
                self.registry.fail(cohort, f"evaluation failed: {exc}", self._clock.now())
            )

    def _scored(self, live: Live, results: Sequence[PairResult]) -> Ended | None:
        """Aggregate a cohort's judged passes and tell the registry (what it ended)."""
        cohort = live.cohort
        try:
            outcome = self._score(cohort, results, live)
        except Exception as exc:
            log.exception("aggregation of cohort %s failed", cohort.key)
            return self.registry.aggregation_failed(
                cohort, f"aggregation failed: {exc}", self._clock.now()
            )
        return self.registry.evaluation_finished(cohort, outcome, self._clock.now())

    def _score(
        self, cohort: Cohort, results: Sequence[PairResult], live: Live | None = None
    ) -> Completed:
        members = cohort.snapshot
        assert members is not None
        texts = [m.candidate.texts for m in members]
        judged = tuple(r.pair for r in results)
        params = self.config
        if self.config.comparison_mode == "fixed_baseline":
            baseline = AnswerTexts("", cohort.prompt.baseline_response or "")
            scores = aggregate(texts, judged, params, baseline=baseline)
        else:
            scores = aggregate(texts, judged, params)
        metrics = dict(scores.metrics)
        metrics.update(usage_metrics([r.usage for r in results]))
        by_member = comparisons_by_member(len(scores.members), judged)
        rewards = tuple(
            MemberReward(
                reward=s.reward,
                score_raw=s.score_raw,
                overall_score=s.overall_score,
                length_adjustment=s.length_adjustment,
                comparisons=by_member[k],
            )
            for k, s in enumerate(scores.members)
        )
        return Completed(
            rewards=rewards,
            metrics=metrics,
            judged=judged,
            passes_reused=live.reused if live is not None else 0,
            passes_resumed=live.resumed if live is not None else 0,
        )

    # ------------------------------------------------------------------ timers
    def _on_collection_deadline(self, live: Live) -> None:
        live.collection_timer = None
        self._conclude(self.registry.collection_deadline(live.cohort, self._clock.now()))

    def _on_evaluation_deadline(self, live: Live) -> None:
        live.evaluation_timer = None
        self._conclude(self.registry.evaluation_deadline(live.cohort, self._clock.now()))

    # ------------------------------------------------------------------ publication
    def _retire(self, cohort: Cohort) -> tuple[Live | None, list[Waiter]]:
        """Stop everything a cohort that left this process runs; return its waiters."""
        live = self._live.pop(cohort.key, None)
        if live is None or live.cohort is not cohort:
            if live is not None:  # a different cohort object under the key: keep it
                self._live[cohort.key] = live
            return None, []
        waiters = [w for ws in live.waiters.values() for w in ws]
        live.waiters.clear()
        for timer in (live.collection_timer, live.evaluation_timer):
            if timer is not None:
                timer.cancel()
        current = asyncio.current_task()
        for task in [*live.pair_tasks.values(), live.eval_task]:
            if task is not None and task is not current and not task.done():
                task.cancel()
        live.pair_tasks.clear()
        self._resume.drop(cohort.key)
        return live, waiters

    def _publish(self, cohort: Cohort, write: asyncio.Future[None] | None) -> None:
        """Hand a terminal cohort's outcome to all its waiters at once, once it is durable.

        ``write`` is the store write of the records that ended it: until it succeeds the
        outcome is neither delivered nor replayed; if it fails, the waiters get
        STORE_UNAVAILABLE and the records are written again until they are stored.
        """
        live, waiters = self._retire(cohort)
        if live is None:
            return
        outcome = cohort.outcome
        assert outcome is not None and cohort.phase in (Phase.COMPLETED, Phase.FAILED)
        self._log_outcome(cohort, outcome, len(waiters))
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
            write = self._persist(records)
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
        _, waiters = self._retire(cohort)
        interrupted = CallInterrupted(
            Reason.SHUTTING_DOWN,
            f"the server is restarting; cohort {cohort.key} is kept in its store and resumes "
            "when it is back: resend the identical member to reattach",
        )
        interrupt(waiters, interrupted)

    def _log_outcome(self, cohort: Cohort, outcome: Outcome, waiters: int) -> None:
        age_s = self._clock.now() - cohort.created_at
        kind: CohortOutcome
        if isinstance(outcome, Completed):
            kind, level, message, reason = "completed", logging.INFO, "cohort completed", None
        elif isinstance(outcome, Masked):
            kind, level, message = "masked", logging.WARNING, "cohort masked: judge failed"
            reason = outcome.reason
        else:
            kind, level, message, reason = (
                "failed",
                logging.WARNING,
                "cohort failed",
                outcome.reason,
            )
        # The fields are built only when the line is written (one per cohort at INFO).
        if log.isEnabledFor(level):
            fields: dict[str, object] = {
                "cohort": str(cohort.key),
                "group_size": cohort.group_size,
                "waiters": waiters,
                "age_s": round(age_s, 3),
                "outcome": kind,
            }
            if reason is not None:
                fields["reason"] = reason
            log.log(level, message, extra=fields)
        self._observer.cohort_finished(cohort.key, kind, age_s)


def _verdict_record(
    key: CohortKey, job: Pass, question: tuple[str, str, str], out: JudgeOutcome
) -> VerdictRecord:
    """The journal entry of a pass the judge answered (the question it was asked)."""
    context, first, second = question
    usage = out.usage
    return VerdictRecord(
        cohort=key,
        scope=key.group_scope,
        context=context,
        first=first,
        second=second,
        judge_index=job.judge_index,
        swap=job.swap,
        response_i=job.i,
        response_j=job.j,
        verdict=out.verdict,
        usage=None
        if usage is None
        else (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens),
        finished_at=time.time(),
    )
