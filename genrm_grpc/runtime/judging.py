"""Judging the passes of live cohorts and of Compare batches.

One :class:`Judging` per process: the judge permits (a priority-ordered concurrency
bound), the pass plan, the journal of verdicts a restart or takeover resumes from,
verdict reuse across attempts, aggregation, and the ownership of every task it starts.
Where a finished pass is journaled (the ``journal`` callback: under the evaluation's
lease) and where a verdict of an earlier attempt is looked up (the ``verdicts`` store)
come from the runtime, which holds one of these; nothing is decided here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from genrm_grpc.cohort.events import AggregationFailed, GroupEvent, Judged, JudgeFailed
from genrm_grpc.cohort.journal import VerdictJournal, judge_context
from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    Member,
    MemberCoords,
    Phase,
    PromptSpec,
    reward_problem,
)
from genrm_grpc.cohort.quota import admits
from genrm_grpc.cohort.records import Record, VerdictRecord
from genrm_grpc.cohort.registry import fill
from genrm_grpc.judge.client import (
    JudgeFailedError,
    JudgeInput,
    JudgeProgress,
    TokenUsage,
)
from genrm_grpc.runtime.live import (
    START_SLICE,
    CompareCapacityError,
    JudgeBackend,
    Live,
    PairProgress,
    PairResult,
    ProgressCallback,
    RuntimeView,
    Waiter,
    all_or_first_error,
    retrieve_exception,
)
from genrm_grpc.runtime.plan import Pass
from genrm_grpc.runtime.scheduler import PrioritySemaphore
from genrm_grpc.runtime.scored import scored, verdict_record
from genrm_grpc.scoring.types import AnswerTexts, JudgedPair
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class VerdictSource(Protocol):
    """Where journaled verdicts of earlier attempts are found (the runtime's store)."""

    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None: ...


class Judging:
    def __init__(
        self,
        judge: JudgeBackend,
        config: RuntimeView,
        *,
        verdicts: VerdictSource,
        journal: Callable[[Live, list[Record]], None],
        wall: Callable[[], float],
        judge_identity: Mapping[str, object] | None = None,
    ) -> None:
        """``journal`` writes a finished pass's record where a restart (or the replica
        that takes the evaluation over) reads it back; ``wall`` is the runtime's clock in
        wall-clock seconds (what records carry); ``judge_identity`` names the judge
        settings that can change a verdict, part of every journaled pass's context."""
        self.config = config
        self._wall = wall
        self._judge = judge
        self._verdicts = verdicts
        self._journal = journal
        self._judge_identity = dict(judge_identity or {})
        self.sem = PrioritySemaphore(config.judge_max_concurrency)
        self.plan = config.pass_plan()
        #: Verdicts journaled before a restart (or a takeover), by cohort and pass.
        self.resume = VerdictJournal(reuse=False)
        self.owned: set[asyncio.Task[Any]] = set()
        #: The cohorts this process collects waiters for or judges.
        self.live: dict[CohortKey, Live] = {}
        self.judge_calls = 0
        self.passes_reused = 0
        self.passes_resumed = 0
        self._ready_seq = 0
        self._compare_passes = 0  # passes of running comparisons (queued or judging)
        self._evaluating = 0
        self._no_evaluations = asyncio.Event()
        self._no_evaluations.set()
        self._grace_over = asyncio.Event()

    # ------------------------------------------------------------------ tasks
    def own(self, coro: Coroutine[Any, Any, _T], *, name: str) -> asyncio.Task[_T]:
        """A task this process cancels and awaits when it stops (:meth:`drain_tasks`)."""
        task = asyncio.create_task(coro, name=name)
        self.owned.add(task)
        task.add_done_callback(self.owned.discard)
        # An eager pair can fail in a cohort that then never fills (or ends otherwise):
        # nobody awaits it, and its exception must not be logged as never retrieved.
        task.add_done_callback(retrieve_exception)
        return task

    async def drain_tasks(self) -> None:
        """Await every owned task that is finishing (after a cancel) or still running."""
        while self.owned:
            await asyncio.gather(*list(self.owned), return_exceptions=True)

    def cancel_all(self) -> None:
        for task in list(self.owned):
            task.cancel()

    # ------------------------------------------------------------------ live cohorts
    def retire(self, key: CohortKey, cohort: Cohort | None = None) -> list[Waiter] | None:
        """Stop everything ``key``'s live cohort runs here (timers, judge tasks, its
        evaluation, unless that is the caller) and forget it; returns its waiters.

        None when it is not live here, or (``cohort`` given) when a different cohort
        object is live under the key, which is kept.
        """
        live = self.live.pop(key, None)
        if live is None:
            return None
        if cohort is not None and live.cohort is not cohort:
            self.live[key] = live  # a different cohort under the key: keep it
            return None
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
        self.resume.drop(key)
        return waiters

    def attach(
        self, cohort: Cohort, slot: int, on_progress: ProgressCallback | None
    ) -> tuple[Live, Waiter, bool]:
        """A new waiter for ``slot`` of ``cohort``, live here from now if it was not
        (then the last item is True)."""
        live = self.live.get(cohort.key)
        created = live is None
        if live is None:
            live = self.live[cohort.key] = Live(cohort=cohort)
        waiter = Waiter(live, slot, on_progress)
        live.waiters.setdefault(slot, set()).add(waiter)
        return live, waiter, created

    def passes_taken(self, key: CohortKey) -> tuple[int, int]:
        """(reused, resumed) journal passes of a live cohort so far."""
        live = self.live.get(key)
        return (0, 0) if live is None else (live.reused, live.resumed)

    def judge_progress(self, key: CohortKey) -> tuple[int, int]:
        """(comparisons at the judge, output tokens they streamed so far) of a cohort
        judged here; (0, 0) otherwise. One lookup: the judge client keeps the counts."""
        live = self.live.get(key)
        return (0, 0) if live is None else (live.judge.in_flight, live.judge.tokens)

    def waiting(self, key: CohortKey) -> int:
        live = self.live.get(key)
        return 0 if live is None else sum(len(w) for w in live.waiters.values())

    # ------------------------------------------------------------------ evaluations
    def evaluation_started(self) -> None:
        """An evaluation runs (shutdown's grace waits for it) until :meth:`evaluation_ended`."""
        self._evaluating += 1
        self._no_evaluations.clear()

    def evaluation_ended(self) -> None:
        self._evaluating -= 1
        if self._evaluating == 0:
            self._no_evaluations.set()

    def end_grace(self) -> None:
        self._grace_over.set()

    async def grace(self, grace_s: float) -> None:
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

    async def judge_all(self, live: Live) -> list[PairResult]:
        """Every pass of a frozen cohort, judged, resumed or reused, in plan order.

        Raises :class:`JudgeFailedError` (the others cancelled) when one fails.
        """
        tasks = []
        for job in self.plan.all_passes(live.cohort.group_size):
            tasks.append(self.start_pair(live, job))
            if len(tasks) % START_SLICE == 0:
                await asyncio.sleep(0)  # a large cohort: let other work run
        return await all_or_first_error(tasks)

    async def verdict_event(self, live: Live) -> GroupEvent:
        """Judge every pass of a frozen cohort: the event that ends its evaluation, for
        for the runtime to decide. A pass failed for good: JudgeFailed (the cohort is
        masked); else :meth:`scored_event`."""
        try:
            results = await self.judge_all(live)
        except JudgeFailedError as exc:
            cohort = live.cohort
            return JudgeFailed(cohort.key, cohort.seq, exc.reason, live.reused, live.resumed)
        return self.scored_event(live, results)

    def scored_event(self, live: Live, results: Sequence[PairResult]) -> GroupEvent:
        """The judged passes aggregated: Judged, or AggregationFailed when that raised."""
        cohort = live.cohort
        try:
            outcome = scored(self.config, cohort, results, live)
        except Exception as exc:
            log.exception("aggregation of cohort %s failed", cohort.key)
            return AggregationFailed(cohort.key, cohort.seq, f"aggregation failed: {exc}")
        return Judged(cohort.key, cohort.seq, outcome)

    def start_ready_pairs(self, live: Live, arrived: int) -> None:
        """Eager: start the passes of the member that arrived whose partners are present."""
        cohort = live.cohort
        for job in self.plan.passes_with(cohort.group_size, arrived, live.durable_slots):
            if job.order not in live.pair_tasks:
                self.start_pair(live, job)

    def start_pair(self, live: Live, job: Pass) -> asyncio.Task[PairResult]:
        task = live.pair_tasks.get(job.order)
        if task is None:
            if live.priority is None:
                self._ready_seq += 1
                live.priority = self._ready_seq
            key = live.cohort.key
            journaled = self.resume.resume(key, job.i, job.j, job.judge_index)
            if journaled is not None:
                # Finished before a restart: its journaled verdict, no judge call.
                coro: Coroutine[Any, Any, PairResult] = self._resumed(live, job, journaled)
            else:
                inp = self._judge_input(live.cohort, job, live.judge)
                coro = self._judge_pair(live, job, inp)
            task = self.own(coro, name=f"judge {key} {job}")
            live.pair_tasks[job.order] = task
        return task

    @staticmethod
    def cancel_pairs(live: Live, *, keep: asyncio.Task[Any] | None = None) -> None:
        for task in live.pair_tasks.values():
            if task is not keep and not task.done():
                task.cancel()

    async def _resumed(self, live: Live, job: Pass, record: VerdictRecord) -> PairResult:
        live.resumed += 1
        self.passes_resumed += 1
        usage = None if record.usage is None else TokenUsage(*record.usage)
        pair = JudgedPair(job.i, job.j, job.judge_index, record.verdict)
        return PairResult(pair, usage, "resumed")

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
        async with self.sem.slot(rank):
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
                    self.cancel_pairs(live, keep=asyncio.current_task())
                raise
        if question is not None:
            # Journaled the moment it finished: a restart resumes without this call.
            record = verdict_record(cohort.key, job, question, out, self._wall())
            self._journal(live, [record])
        self._progress(live, job)
        return PairResult(JudgedPair(job.i, job.j, job.judge_index, out.verdict), out.usage)

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
            found = await self._verdicts.find_verdict(
                scope, context, first, second, job.judge_index, job.swap
            )
        except StoreError as exc:
            log.warning("verdict journal lookup failed, judging instead: %s", exc)
            return None
        if found is None or found.verdict.parse_failed:
            # A verdict that fell back to the default scores is asked again.
            return None
        return PairResult(JudgedPair(job.i, job.j, job.judge_index, found.verdict), None, "reused")

    # ------------------------------------------------------------------ Compare
    async def compare(
        self, prompt: PromptSpec, candidates: Sequence[CandidateSpec], now: float
    ) -> Completed:
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
        passes = self.plan.pass_count(n)
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
            created_at=now,
            collection_deadline=math.inf,
            members={k: Member(MemberCoords(rollout_index=k), c) for k, c in enumerate(candidates)},
        )
        fill(cohort, None)  # every member at once
        live = Live(cohort=cohort, priority=self._ready_seq, spread=True)
        # Counted as an evaluation so that shutdown grants it the same grace.
        self.evaluation_started()
        try:
            tasks = [self.start_pair(live, job) for job in self.plan.all_passes(n)]
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
            outcome = scored(self.config, cohort, results)
            problem = reward_problem(outcome.rewards, n)
            if problem is not None:
                raise ValueError(problem)
            return outcome
        finally:
            self._compare_passes -= passes
            self.evaluation_ended()

    def stats(self) -> dict[str, int]:
        return {
            "live_cohorts": len(self.live),
            "waiters": sum(len(w) for live in self.live.values() for w in live.waiters.values()),
            "owned_tasks": len(self.owned),
            "judge_in_flight": self.sem.in_use,
            "judge_waiting": self.sem.waiting,
            "judge_calls": self.judge_calls,
            "compare_passes": self._compare_passes,
            "passes_reused": self.passes_reused,
            "passes_resumed": self.passes_resumed,
        }
