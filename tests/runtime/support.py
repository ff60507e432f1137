"""A scripted judge, runtime builders and the leak check shared by the runtime tests.

The scripted judge stands in for the HTTP judge client: each call blocks on its own
``asyncio.Event`` until the test releases it (with a verdict) or fails it, so the
tests decide exactly when each comparison finishes. Nothing here sleeps for time:
``until``/``settle`` only yield to the event loop, which runs ready tasks in FIFO
order, so every interleaving is reproducible.

The runtime is the server's one runtime (``ReplicaRuntime``) over the in-process group
store (``memory://``, or a file behind it: the one-replica case), on the test's
``ManualClock``. A decision is a task (read, decide, commit), so what a call decides
happens a few loop turns later: the tests ``settle`` before they look.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from genrm_grpc.cohort.identity import CandidateInput, ComparisonMode, resolve
from genrm_grpc.cohort.model import (
    Cohort,
    CohortKey,
    Completed,
    Masked,
    MemberCoords,
    Phase,
    PromptSpec,
    Submission,
    Tombstone,
)
from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeFailedError, JudgeInput, JudgeOutcome, TokenUsage
from genrm_grpc.runtime.live import JudgeSchedule, Ticket
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.store.durable import DurableStore
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.testing import ManualClock

PROMPT = PromptSpec(messages=(("user", "Name the largest planet."),), principle="Be accurate.")
COLLECTION_S = 100.0
EVALUATION_S = 50.0
DEFAULT_VERDICT = Verdict(4.0, 2.0, 2.0)
USAGE = TokenUsage(input_tokens=100, output_tokens=10, reasoning_tokens=3)
#: The runtime's evaluation lease in the tests: longer than any jump a test
#: makes with its ManualClock (a jump is time the whole process lives through at once,
#: renewals included), unless a test is about the lease.
LEASE_S = 3600.0

Runtime: TypeAlias = ReplicaRuntime


def text(gid: str | None, i: int, attempt: int | None = 0) -> str:
    return f"{gid}/{attempt}/{i}: Jupiter"


def sub(
    i: int,
    *,
    gid: str | None = "g",
    attempt: int | None = 0,
    size: int = 3,
    answer: str | None = None,
    prompt: PromptSpec = PROMPT,
    task_index: int | None = None,
    mode: ComparisonMode = "rollout_cohort",
) -> Submission:
    coords = MemberCoords(
        rollout_index=i,
        group_id=gid,
        group_attempt=attempt,
        task_index=task_index,
        group_size=size,
    )
    candidate = CandidateInput(
        output_text=text(gid, i, attempt) if answer is None else answer, reasoning_text="hmm"
    )
    got = resolve(coords, prompt, candidate, default_group_size=size, mode=mode)
    assert isinstance(got, Submission), got
    return got


@dataclass(eq=False)
class Call:
    """One judge call; blocked until the test releases or fails it."""

    index: int
    inp: JudgeInput
    swap: bool
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    verdict: Verdict | None = None
    error: BaseException | None = None
    state: str = "blocked"  # blocked | done | failed | cancelled
    #: A misbehaving backend that ignores cancellation and answers when released.
    stubborn: bool = False
    cancels_ignored: int = 0

    def release(self, verdict: Verdict | None = None) -> None:
        self.verdict = verdict
        self.gate.set()

    def fail(self, reason: str = "judge failed: HTTP 503 on every attempt") -> None:
        self.error = JudgeFailedError(reason)
        self.gate.set()

    def raise_(self, error: BaseException) -> None:
        self.error = error
        self.gate.set()

    @property
    def pair(self) -> tuple[str, str]:
        return (self.inp.response_1, self.inp.response_2)


class ScriptedJudge:
    """A JudgeBackend whose calls the test controls one by one."""

    def __init__(
        self,
        *,
        auto: bool = False,
        verdict: Callable[[JudgeInput], Verdict] | None = None,
    ) -> None:
        self.auto = auto
        self.calls: list[Call] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._verdict = verdict or (lambda _inp: DEFAULT_VERDICT)

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        call = Call(len(self.calls), inp, swap)
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.auto:
                call.gate.set()
            while not call.gate.is_set():
                try:
                    await call.gate.wait()
                except asyncio.CancelledError:
                    if not call.stubborn:
                        call.state = "cancelled"
                        raise
                    call.cancels_ignored += 1
            if self.auto:
                await asyncio.sleep(0)  # a real judge always yields
            if call.error is not None:
                call.state = "failed"
                raise call.error
            call.state = "done"
            verdict = call.verdict if call.verdict is not None else self._verdict(inp)
            return JudgeOutcome(verdict=verdict, usage=USAGE, attempts=1)
        finally:
            self.in_flight -= 1

    def blocked(self) -> list[Call]:
        return [c for c in self.calls if c.state == "blocked"]

    def release_all(self, verdict: Verdict | None = None) -> None:
        for call in self.blocked():
            call.release(verdict)


def make_runtime(
    judge: ScriptedJudge,
    clock: ManualClock,
    *,
    collection_s: float = COLLECTION_S,
    evaluation_s: float = EVALUATION_S,
    max_active: int = 1000,
    schedule: JudgeSchedule = "after_collection",
    concurrency: int = 64,
    mode: ComparisonMode = "rollout_cohort",
    position_debias: bool = False,
    max_queued_compare_passes: int = 4096,
    lease_clock: ManualClock | None = None,
    behind: DurableStore | None = None,
    **scoring: Any,
) -> Runtime:
    """A runtime over one ``Settings``; ``scoring`` are further keys (scoring knobs).

    Not opened yet (:func:`open_runtime` does, and :func:`close_runtime` stops it).
    ``lease_clock``: what the in-process store's leases count in (``clock`` when None);
    ``behind``: the file behind the in-process store (None: nothing, as ``memory://``).
    """
    scoring = {"replica_lease_s": LEASE_S, **scoring}
    settings = Settings(
        cohort_collection_timeout_s=collection_s,
        cohort_evaluation_timeout_s=evaluation_s,
        max_active_cohorts=max_active,
        comparison_mode=mode,
        judge_schedule=schedule,
        judge_max_concurrency=concurrency,
        position_debias=position_debias,
        max_queued_compare_passes=max_queued_compare_passes,
        # No principle unless a test sets one: judge inputs stay as the tests spell them.
        default_principle="",
        **scoring,
    )
    shared = LocalGroups(
        settings,
        lease_s=settings.replica_lease_s,
        behind=behind,
        clock=clock,
        lease_clock=lease_clock,
    )
    # No batching window: a decision starts at the next loop turn, with whatever queued
    # by then (the window is loop time, which the tests do not wait for).
    return ReplicaRuntime(judge, settings, shared=shared, clock=clock, batch_window_s=0.0)


async def open_runtime(runtime: Runtime) -> Runtime:
    await runtime.open()
    return runtime


async def close_runtime(runtime: Runtime) -> None:
    """Stop what a test left running (the runtime's background work)."""
    await runtime.shutdown(0)  # (again, if the test did: nothing is left to stop)
    await runtime.close()


async def submit(runtime: Runtime, member: Submission, **kw: Any) -> Ticket:
    """One member's decision, as the servicer asks for it."""
    return await runtime.submit(member, **kw)


async def lookup(runtime: Runtime, key: CohortKey) -> Cohort | Tombstone | None:
    """``key`` as the runtime's store holds it now: a copy read from the group store."""
    registry, now = await runtime.view(key)
    return registry.lookup(key, now)


async def phase_of(runtime: Runtime, key: CohortKey) -> Phase | None:
    """The phase of ``key``'s cohort now, an ended one's from its tombstone."""
    found = await lookup(runtime, key)
    if isinstance(found, Cohort):
        return found.phase
    if isinstance(found, Tombstone):
        completed = isinstance(found.outcome, Completed | Masked)
        return Phase.COMPLETED if completed else Phase.FAILED
    return None


async def advance(clock: ManualClock, seconds: float) -> None:
    """Move time and let what its timers started run (a decision is a task)."""
    clock.advance(seconds)
    await settle()


async def until(predicate: Callable[[], bool], *, spins: int = 2000) -> None:
    """Yield to the loop until ``predicate`` holds (fails the test if it never does)."""
    for _ in range(spins):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def settle(spins: int = 50) -> None:
    """Let every ready task run to its next blocking point."""
    for _ in range(spins):
        await asyncio.sleep(0)


async def assert_no_leaks(
    runtime: Runtime,
    *,
    judge: ScriptedJudge | None = None,
    cohorts: Iterable[Cohort] = (),
) -> None:
    """After a scenario: no task, waiter, permit or cohort body is left behind.

    The group store holds no active cohort, deadline (nor its timer) or evaluation, and
    the runtime no decision, cached group state or evaluation (``cohorts`` are copies:
    their keys are checked in the store).
    """
    await settle()
    await runtime.drain_tasks()
    stats = runtime.stats()
    assert stats["owned_tasks"] == 0, stats
    assert stats["judge_in_flight"] == 0, stats
    assert stats["waiters"] == 0, stats
    assert stats["live_cohorts"] == 0, stats
    assert stats["evaluating_here"] == 0, stats
    assert runtime.decisions.pending() == (0, 0)
    assert isinstance(runtime.shared, LocalGroups)
    held = runtime.shared.state
    assert held.active_total == 0 and not held.cohorts, list(held.cohorts)
    assert not held.deadlines.at and held.deadline_timers() == 0, held.deadlines.at
    assert not held.evaluations.at, held.evaluations.at
    assert {c.key for c in cohorts}.isdisjoint(held.cohorts)
    if judge is not None:
        assert judge.in_flight == 0
        assert not judge.blocked()
