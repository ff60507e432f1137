"""What the runtime hands its callers, and the state it keeps per live cohort.

:class:`Runtime` is what the servicer, the server and the metrics call, whichever group
store is under it. A call gets a :class:`Ticket` (a :class:`Waiter`, a replayed
tombstone or a rejection) or a :class:`CallInterrupted`; a cohort being collected or
judged is a :class:`Live`: its waiters, timers, judge tasks and the lease it is judged
under. The runtime
(``runtime/replica.py``) and its parts (``judging.py``, ``leased.py``, ...) share these
types and the helpers that deliver an outcome or wait for a cohort's passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from genrm_grpc.cohort.clock import TimerHandle
from genrm_grpc.cohort.identity import ComparisonMode
from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    Masked,
    Outcome,
    PromptSpec,
    Reason,
    Rejection,
    Submission,
    Tombstone,
)
from genrm_grpc.cohort.registry import CohortRegistry, Disposition
from genrm_grpc.judge.client import (
    JudgeInput,
    JudgeOutcome,
    JudgeProgress,
    TokenUsage,
)
from genrm_grpc.observability.hooks import CohortOutcome, RuntimeObserver
from genrm_grpc.runtime.plan import PassPlan
from genrm_grpc.scoring.types import JudgedPair, ScoringView
from genrm_grpc.store.records import StoreError

#: The logger of the one line per ended cohort. Its name is the one these lines have
#: always carried (operators filter and route on it), kept when the module it named
#: went (one runtime since issue 22).
outcome_log = logging.getLogger("genrm_grpc.runtime.engine")

JudgeSchedule = Literal["after_collection", "eager"]


class CallInterrupted(Exception):
    """A waiting call ends without its cohort's outcome; the cohort itself goes on.

    ``STORE_UNAVAILABLE``: what the answer depends on could not be made durable.
    ``SHUTTING_DOWN``: the server is restarting and keeps the cohort in its store.
    Either way an identical resend reattaches (to the restarted server).
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def store_unavailable(what: str, error: BaseException) -> CallInterrupted:
    return CallInterrupted(
        Reason.STORE_UNAVAILABLE,
        f"the server could not make {what} durable ({error}); nothing was published: "
        "retry the identical call",
    )


class CompareCapacityError(Exception):
    """A Compare would queue more judge passes than ``max_queued_compare_passes``."""


class JudgeBackend(Protocol):
    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome: ...


class RuntimeView(ScoringView, Protocol):
    """The settings the runtime reads: its own plus the scoring knobs it aggregates with.

    A read-only scoped view; ``genrm_grpc.config.Settings`` declares each key once (name,
    default, validation) and satisfies it.
    """

    @property
    def comparison_mode(self) -> ComparisonMode: ...
    @property
    def judge_schedule(self) -> JudgeSchedule: ...
    @property
    def judge_max_concurrency(self) -> int: ...
    @property
    def use_principle(self) -> bool: ...
    @property
    def default_principle(self) -> str: ...
    #: Alternate judge passes swap the two answers (only with ≥ 2 judges per comparison).
    @property
    def position_debias(self) -> bool: ...
    #: Passes of running Compare calls (queued or judging) above which a new one is
    #: refused with CompareCapacityError.
    @property
    def max_queued_compare_passes(self) -> int: ...
    #: ``group``: a pass of a later attempt of a group that asks the judge the same
    #: question as one already journaled takes that verdict; ``off``: always judged.
    @property
    def verdict_reuse(self) -> Literal["group", "off"]: ...
    #: The judge passes of a cohort (comparison mode, strategy, judges, position debias).
    def pass_plan(self) -> PassPlan: ...


@dataclass(frozen=True, slots=True)
class Census:
    """What the server holds now, for the state gauges (``genrm_cohorts``,
    ``genrm_tombstones``, ``genrm_attempt_watermarks``): this process's registry, or the
    whole deployment's as a replica last read it from the shared store."""

    collecting: int = 0
    evaluating: int = 0
    tombstones: int = 0
    watermarks: int = 0


@dataclass(frozen=True, slots=True)
class PairProgress:
    key: CohortKey
    response_i: int
    response_j: int
    judge_index: int


ProgressCallback = Callable[[PairProgress], None]


#: A complete cohort's passes are started in slices of this many, with a yield to the
#: event loop in between, so that a large cohort never freezes the loop.
START_SLICE = 256
#: After a failed write of what a decision depends on (a cohort's final records, an
#: evaluation's end), how long until it is tried again.
REWRITE_DELAY_S = 1.0


@dataclass(frozen=True, slots=True)
class PairResult:
    pair: JudgedPair
    usage: TokenUsage | None
    #: "judged", "reused" (an earlier attempt's verdict) or "resumed" (from before a restart)
    source: str = "judged"


class Waiter:
    """One caller waiting for its member's cohort outcome."""

    __slots__ = ("_live", "future", "on_progress", "slot")

    def __init__(self, live: Live | None, slot: int, on_progress: ProgressCallback | None) -> None:
        self._live = live
        self.slot = slot
        self.on_progress = on_progress
        self.future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

    @classmethod
    def ended(cls, slot: int, outcome: Outcome) -> Waiter:
        """A waiter whose cohort ended before it came: its outcome is there, nothing of
        the cohort is live to attach it to."""
        waiter = cls(None, slot, None)
        waiter.future.set_result(outcome)
        return waiter

    async def wait(self) -> Outcome:
        try:
            return await self.future
        finally:
            self.release()

    def release(self) -> None:
        """Remove this waiter only; the member stays in its cohort."""
        live, self._live = self._live, None
        if live is not None:
            waiters = live.waiters.get(self.slot)
            if waiters is not None:
                waiters.discard(self)
                if not waiters:
                    del live.waiters[self.slot]
        if not self.future.done():
            self.future.cancel()


@dataclass(slots=True)
class Ticket:
    """What a submission got: a waiter, a replayed tombstone, or a rejection.

    ``durable`` (when not None) resolves once what the submission changed, or the
    replayed outcome, is in the store: answer nothing before it (it raises
    :class:`CallInterrupted` when the store failed).
    """

    disposition: Disposition
    waiter: Waiter | None = None
    replay: Tombstone | None = None
    rejection: Rejection | None = None
    durable: asyncio.Future[None] | None = None

    def store_failure(self) -> CallInterrupted | None:
        """The typed interruption when ``durable`` failed (None: durable or not done)."""
        durable = self.durable
        if durable is None or not durable.done():
            return None
        error = StoreError("cancelled") if durable.cancelled() else durable.exception()
        return None if error is None else store_unavailable("this member", error)

    def interrupt_if_unwritten(self) -> None:
        """End the waiter with STORE_UNAVAILABLE if ``durable`` fails (now or later)."""
        durable, waiter = self.durable, self.waiter
        if durable is None or waiter is None:
            return
        if durable.done():
            self._interrupt_waiter()
        else:
            durable.add_done_callback(lambda _: self._interrupt_waiter())

    def _interrupt_waiter(self) -> None:
        failure = self.store_failure()
        waiter = self.waiter
        if failure is not None and waiter is not None:
            interrupt([waiter], failure)

    async def persisted(self) -> None:
        """Wait until ``durable``; raises :class:`CallInterrupted` when the write failed."""
        durable = self.durable
        if durable is not None and not durable.done():
            await asyncio.wait([durable])
        failure = self.store_failure()
        if failure is not None:
            raise failure


@dataclass(slots=True, eq=False)
class Live:
    cohort: Cohort
    waiters: dict[int, set[Waiter]] = field(default_factory=dict)
    collection_timer: TimerHandle | None = None
    evaluation_timer: TimerHandle | None = None
    pair_tasks: dict[int, asyncio.Task[PairResult]] = field(default_factory=dict)
    eval_task: asyncio.Task[None] | None = None
    priority: int | None = None
    #: A Compare: its passes are spread over later ranks (fair against cohorts).
    spread: bool = False
    #: Reason of the first JudgeFailedError: the cohort is masked, spend no more calls.
    judge_failure: str | None = None
    #: The judge_context digest of its passes (computed once).
    context: str | None = None
    reused: int = 0
    resumed: int = 0
    #: A write carrying its header or a member failed: a resend writes them again.
    unwritten: bool = False
    #: Replicas: the evaluation lease this process judges the cohort under, and the
    #: journal writes of its passes (the outcome is committed after them).
    lease: Any = None
    journal_writes: list[asyncio.Future[None]] = field(default_factory=list)
    #: Slots whose member record is known to be in the store (eager pairs start only
    #: between those).
    durable_slots: set[int] = field(default_factory=set)
    #: Its comparisons at the judge now and the tokens they streamed (the client counts).
    judge: JudgeProgress = field(default_factory=JudgeProgress)


class Runtime(Protocol):
    """The calls the runtime answers (``runtime/replica.py``): what the servicer, the
    server and the metrics see of it."""

    @property
    def draining(self) -> bool: ...
    def start_draining(self) -> None: ...
    @property
    def judge_calls(self) -> int: ...
    def now(self) -> float: ...
    async def open(self) -> int: ...
    async def submit(
        self, sub: Submission, *, on_progress: ProgressCallback | None = None
    ) -> Ticket: ...
    async def view(self, key: CohortKey) -> tuple[CohortRegistry, float]: ...
    async def cancel_cohort(self, key: CohortKey, reason: str) -> bool: ...
    async def compare(
        self, prompt: PromptSpec, candidates: Sequence[CandidateSpec]
    ) -> Completed: ...
    def passes_taken(self, key: CohortKey) -> tuple[int, int]: ...
    def judge_progress(self, key: CohortKey) -> tuple[int, int]: ...
    def stats(self) -> dict[str, int]: ...
    def census(self) -> Census: ...
    async def refresh_census(self) -> Census: ...
    async def shutdown(self, grace_s: float) -> None: ...
    def end_grace(self) -> None: ...
    async def drain_tasks(self) -> None: ...
    async def flush(self) -> None: ...
    async def close(self) -> None: ...


def deliver(waiters: list[Waiter], outcome: Outcome) -> None:
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_result(outcome)


def interrupt(waiters: list[Waiter], error: CallInterrupted) -> None:
    for waiter in waiters:
        if not waiter.future.done():
            waiter.future.set_exception(error)
            waiter.future.exception()  # retrieved: a caller that left logs nothing


def retrieve_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def all_or_first_error(tasks: list[asyncio.Task[PairResult]]) -> list[PairResult]:
    """Results in order; on the first failure cancel and await the rest, then raise it.

    One done callback per task and a countdown: O(1) work per finished task (waiting
    with ``asyncio.wait`` in a loop re-registers a callback on every pending task each
    time one finishes). A task that is cancelled does not end the wait early; its
    CancelledError surfaces from its result at the end, as it would from ``asyncio.wait``.
    """
    if not tasks:
        return []
    first_error: asyncio.Future[asyncio.Task[PairResult] | None]
    first_error = asyncio.get_running_loop().create_future()
    remaining = len(tasks)

    def finished(task: asyncio.Task[PairResult]) -> None:
        nonlocal remaining
        remaining -= 1
        if first_error.done():
            return
        if not task.cancelled() and task.exception() is not None:
            first_error.set_result(task)
        elif remaining == 0:
            first_error.set_result(None)

    for task in tasks:
        task.add_done_callback(finished)
    try:
        failed = await first_error
    finally:
        pending = []
        for task in tasks:
            task.remove_done_callback(finished)
            if not task.done():
                task.cancel()
                pending.append(task)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    if failed is not None:
        error = failed.exception()
        assert error is not None
        raise error
    return [task.result() for task in tasks]


def usage_metrics(usages: Sequence[TokenUsage | None]) -> dict[str, float]:
    known = [u for u in usages if u is not None]
    if not known:
        return {}
    outputs = [u.output_tokens for u in known]
    return {
        "judge_input_tokens_total": float(sum(u.input_tokens for u in known)),
        "judge_output_tokens_total": float(sum(outputs)),
        "judge_reasoning_tokens_total": float(sum(u.reasoning_tokens for u in known)),
        "judge_output_tokens_mean": sum(outputs) / len(outputs),
        "judge_output_tokens_max": float(max(outputs)),
        "judge_cached_tokens_total": float(sum(u.cached_tokens for u in known)),
        "judge_output_tokens_wasted_total": float(sum(u.wasted_output_tokens for u in known)),
        "judge_adaptive_budget_cuts": float(sum(u.adaptive_cuts for u in known)),
    }


def log_outcome(
    observer: RuntimeObserver, cohort: Cohort, outcome: Outcome, waiters: int, age_s: float
) -> None:
    """One log line per ended cohort (built only when written) and the observer's count."""
    kind: CohortOutcome
    if isinstance(outcome, Completed):
        kind, level, message, reason = "completed", logging.INFO, "cohort completed", None
    elif isinstance(outcome, Masked):
        kind, level, message = "masked", logging.WARNING, "cohort masked: judge failed"
        reason = outcome.reason
    else:
        kind, level, message, reason = "failed", logging.WARNING, "cohort failed", outcome.reason
    if outcome_log.isEnabledFor(level):
        fields: dict[str, object] = {
            "cohort": str(cohort.key),
            "group_size": cohort.group_size,
            "waiters": waiters,
            "age_s": round(age_s, 3),
            "outcome": kind,
        }
        if reason is not None:
            fields["reason"] = reason
        outcome_log.log(level, message, extra=fields)
    observer.cohort_finished(cohort.key, kind, age_s)
