"""The one runtime: of one replica among several sharing a Redis store (docs/scaling.md),
and of a single process deciding as its deployment's one replica (over
``genrm_grpc.store.local``; what is said of Redis below holds for that store too).

Every rule stays in the registry. For each event a replica reads the group from Redis
into a registry that holds only that group, applies the event there, and commits the
records with a compare-and-set on the group's version (``genrm_grpc.store.shared``); a
refused commit means another replica changed the group: read and decide again. So
members of one group may reach any replica in any order, with one process's outcome.

- **Deciding** (bursts of events per key decided together, no read after its own
  commit, the retries of a refused commit) is ``runtime/group_decisions.py``; this
  module executes what a committed decision means here.
- **Waiters** stay on the replica that holds the call. An outcome is committed to a
  mailbox key and its cohort's key published on the replicas' channel in one script;
  every replica reads the outcomes its waiters need, and all again after it
  (re)subscribes, so a message lost while disconnected costs nothing
  (``runtime/outcomes.py``).
- **Evaluation** belongs to the replica whose commit froze the cohort (or, eager,
  created it), under the cohort's evaluation lease: ``runtime/leased.py``. When the
  lease expires (the replica died, paused or lost Redis) any replica's sweep claims it.
- **Gauges** of what the deployment holds (cohorts by phase, tombstones, watermarks)
  are read from the shared counts and indexes every ``STORE_CHECK_S``, with the check
  that Redis answers; every replica reports the deployment's figures.
- **Deadlines** live in one sorted set; every replica looks for due ones every
  ``SWEEP_S``, and the version check lets exactly one of them end the cohort; the
  in-process store's are its clock's timers (``runtime/replica_sweeps.py``).
- **Time** is the ``clock`` (wall-clock seconds; tests: ``ManualClock``).
- ``judge_max_concurrency`` bounds each replica's judge calls, not the deployment's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from genrm_grpc.cohort.clock import Clock
from genrm_grpc.cohort.events import (
    Cancelled,
    GroupEvent,
    MemberArrived,
    NotActive,
)
from genrm_grpc.cohort.model import (
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    PromptSpec,
    Reason,
    Submission,
)
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, SubmitDecision
from genrm_grpc.observability.hooks import NullRuntimeObserver, RuntimeObserver
from genrm_grpc.runtime.clock import WallClock, sleep
from genrm_grpc.runtime.decided import Decided
from genrm_grpc.runtime.group_decisions import GroupDecisions, GroupView
from genrm_grpc.runtime.group_store import GroupStore, InstantGroups
from genrm_grpc.runtime.judging import Judging
from genrm_grpc.runtime.leased import LeasedEvaluations
from genrm_grpc.runtime.live import (
    CallInterrupted,
    Census,
    JudgeBackend,
    Live,
    ProgressCallback,
    Ticket,
    Waiter,
    deliver,
    interrupt,
    log_outcome,
    store_unavailable,
)
from genrm_grpc.runtime.outcomes import Outcomes
from genrm_grpc.runtime.replica_sweeps import SWEEP_S, Sweeps
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)

#: How often a replica checks that Redis answers (health) while it does.
STORE_CHECK_S = 1.0


class ReplicaView(GroupView, Protocol):
    @property
    def replica_lease_s(self) -> float: ...


class ReplicaRuntime:
    """One replica: decides every event on its group as Redis holds it (module doc)."""

    def __init__(
        self,
        judge: JudgeBackend,
        config: ReplicaView,
        *,
        shared: GroupStore,
        observer: RuntimeObserver | None = None,
        judge_identity: dict[str, object] | None = None,
        on_store_health: Callable[[bool], Awaitable[None]] | None = None,
        clock: Clock | None = None,
        batch_window_s: float | None = None,
    ) -> None:
        """``clock``: wall-clock seconds by default (what replicas sharing Redis
        compare); the in-process store's own should be the same clock."""
        #: This process refuses new cohorts (a drain began); the one-group registries
        #: it decides in read it.
        self._draining = False
        self.config = config
        self.shared = shared
        self.store = shared.store
        self._clock: Clock = clock if clock is not None else WallClock()
        self._observer: RuntimeObserver = observer or NullRuntimeObserver()
        self.judging = Judging(
            judge,
            config,
            verdicts=shared.store,
            journal=lambda live, records: self.evaluations.journal(live, records),
            wall=self._clock.now,
            judge_identity=judge_identity,
        )
        self._live = self.judging.live
        self._closed = False
        self.store_available = True
        self._on_store_health = on_store_health
        self.decisions = GroupDecisions(
            shared,
            config,
            draining=lambda: self._draining,
            own=self.judging.own,
            committed=self._committed,
            clock=self._clock,
            settle=self._scored_at_once,
            batch_window_s=batch_window_s,
        )
        self.evaluations = self._evaluations()
        self._stopping = asyncio.Event()
        self.outcomes = Outcomes(
            shared, self.judging, self.evaluations, clock=self._clock, stopping=self._stopping
        )
        self.sweeps = self._sweeps()
        self._background: list[asyncio.Task[None]] = []
        #: The deployment's counts as the store watcher last read them (STORE_CHECK_S).
        self._census = Census()
        self._instant = shared if isinstance(shared, InstantGroups) else None

    def _evaluations(self) -> LeasedEvaluations:
        return LeasedEvaluations(
            self.shared,
            self.config,
            self.judging,
            self.decisions,
            hand_off=self._hand_off,
            store_failed=self._store_failed,
            clock=self._clock,
        )

    def _sweeps(self) -> Sweeps:
        return Sweeps(
            self.shared,
            self.decisions,
            self.evaluations,
            clock=self._clock,
            own=self.judging.own,
            stopping=self._stopping,
            draining=lambda: self._draining,
            recheck=self.outcomes.resubscribed,
            store_failed=self._store_failed,
        )

    # ------------------------------------------------------------------ API
    def now(self) -> float:
        return self._clock.now()

    @property
    def draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        """Refuse new cohorts from now on (what a drain does first)."""
        self._draining = True

    @property
    def judge_calls(self) -> int:
        return self.judging.judge_calls

    def passes_taken(self, key: CohortKey) -> tuple[int, int]:
        return self.judging.passes_taken(key)

    def judge_progress(self, key: CohortKey) -> tuple[int, int]:
        return self.judging.judge_progress(key)

    async def compare(self, prompt: PromptSpec, candidates: Sequence[CandidateSpec]) -> Completed:
        """A batch judged at once by this replica (no cohort, nothing shared)."""
        return await self.judging.compare(prompt, candidates, self._clock.now())

    def end_grace(self) -> None:
        self.judging.end_grace()

    async def drain_tasks(self) -> None:
        await self.judging.drain_tasks()

    async def close(self) -> None:
        """Close the store connection (after :meth:`shutdown`); idempotent."""
        if not self._closed:
            self._closed = True
            await self.store.close()

    # ------------------------------------------------------------------ life cycle
    async def open(self) -> int:
        """Reach the group store (RedisStartupError naming Redis when unreachable; a
        file behind the in-process store is read back) and start the background work;
        returns the active cohorts read back. Orphaned evaluations and due deadlines are
        picked up by the sweeps (in process: by the store's deadline timers)."""
        self.sweeps.watch()
        recovered = await self.shared.connect()
        await self.shared.store.start()
        loop = asyncio.get_running_loop()
        for coro, name in (
            (
                self.shared.listen(
                    self.outcomes.on_ended,
                    self.outcomes.resubscribed,
                    stopping=self._stopping,
                    on_grown=self.evaluations.grown,
                ),
                "replica-listen",
            ),
            (self.sweeps.sweep(), "replica-sweep"),
            (self._watch_store(), "replica-store-health"),
        ):
            self._background.append(loop.create_task(coro, name=name))
        return recovered

    async def shutdown(self, grace_s: float) -> None:
        """Drain: refuse new cohorts, let evaluations run for ``grace_s``, fail the rest
        (a store nothing outlives) or release their leases, interrupt the waiters."""
        self.start_draining()
        await self.judging.grace(grace_s)
        if not self.store.survives_restart:
            # Nothing outlives this process (memory://): the cohorts fail, as documented.
            await self._fail_all("server is shutting down")
        self._stopping.set()
        self.decisions.stop()
        self.sweeps.stop()
        handoffs = []
        for key in list(self.evaluations.here):
            live = self._live.get(key)
            if live is not None and live.eval_task is not None:
                live.eval_task.cancel()
            if live is not None and isinstance(live.lease, Lease):
                handoffs.append(self._hand_off(key, live.lease))
        await asyncio.gather(*handoffs, return_exceptions=True)
        interrupted = self._interruption()
        for live in list(self._live.values()):
            waiters = [w for ws in live.waiters.values() for w in ws]
            live.waiters.clear()
            interrupt(waiters, interrupted)
        self._live.clear()
        for task in [*self._background, *self.judging.owned]:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.drain_tasks()
        await self.flush()

    async def _fail_all(self, reason: str) -> None:
        """Fail every active cohort: its waiters here get the failure, as a later member."""
        for live in self._live.values():
            if live.eval_task is not None:
                live.eval_task.cancel()
        try:
            keys = await self.shared.active_keys()
            await asyncio.gather(
                *(self.decisions.apply(k, Cancelled(k, None, reason)) for k in keys)
            )
        except StoreError as exc:
            log.warning("could not fail the active cohorts at shutdown: %s", exc)

    def _interruption(self) -> CallInterrupted:
        """What a waiting call gets when this process stops (docs/durability.md)."""
        if self.shared.shared_by_replicas:
            message = (
                "this replica is shutting down; the cohort goes on in the shared store: "
                "resend the identical member (to another replica) to reattach"
            )
        elif self.store.survives_restart:
            message = (
                "the server is restarting; the cohort is kept in its store and resumes when "
                "it is back: resend the identical member to reattach"
            )
        else:  # memory://: the stop failed every cohort, nothing resumes
            message = "the server is shutting down and keeps nothing: send the group again"
        return CallInterrupted(Reason.SHUTTING_DOWN, message)

    async def _hand_off(self, key: CohortKey, lease: Lease) -> None:
        try:
            await self.shared.release(key, lease)
        except StoreError as exc:
            log.warning("could not hand evaluation of %s over (%s); its lease expires", key, exc)

    async def flush(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        shared = self.shared.stats
        return {
            **self.judging.stats(),
            # Failed group commits and journal writes (their calls got STORE_UNAVAILABLE).
            "store_failures": shared.failures + self.store.write_failures,
            # The deployment's active cohorts: held now in process, else as last read
            # (the registry here holds none between decisions).
            "active_cohorts": (
                shared.active_seen if self._instant is None else self._instant.counts_now()[0]
            ),
            "evaluating_here": len(self.evaluations.here),
            "takeovers": shared.takeovers,
            "leases_lost": shared.leases_lost,
            "lease_renewals": shared.renewals,
            "group_commits": shared.commits,
            "commit_conflicts": shared.conflicts,
            "store_available": int(self.store_available),
        }

    def census(self) -> Census:
        """The whole deployment's counts: as held now on the in-process store; on Redis
        as last read (every replica reports the same, a second old at most). The
        registry holds one group at a time, and none between."""
        instant = self._instant
        if instant is not None:
            self._census = _census_of(*instant.counts_now())
        return self._census

    async def refresh_census(self) -> Census:
        """Read the deployment's counts now (one round trip; StoreError when Redis is down)."""
        self._census = _census_of(*await self.shared.census(self._clock.now()))
        return self._census

    def _committed(
        self,
        done: Decided,
        started: list[CohortKey],
        now: float,
        judge_here: tuple[CohortKey, Lease] | None,
    ) -> None:
        """What a committed decision means here: started cohorts counted, ended ones
        logged and handed to this replica's waiters."""
        for started_key in dict.fromkeys(started):
            self._observer.cohort_started(started_key)
        for cohort in done.ended:
            assert cohort.outcome is not None
            age_s = now - cohort.created_at
            log_outcome(
                self._observer, cohort, cohort.outcome, self.judging.waiting(cohort.key), age_s
            )
            self.outcomes.end_here(cohort.key, now, cohort.outcome)
        if judge_here is not None:
            self.evaluations.start(*judge_here)

    def _scored_at_once(self, cohort: Cohort) -> GroupEvent | None:
        """A 1-member cohort needs no judge call: it is scored in the decision that froze
        it (as the single process always did), not by an evaluation under a lease."""
        if cohort.group_size != 1 or self.judging.plan.pass_count(1):
            return None
        return self.judging.scored_event(Live(cohort=cohort), [])

    # ------------------------------------------------------------------ API
    async def submit(
        self, sub: Submission, *, on_progress: ProgressCallback | None = None
    ) -> Ticket:
        """Decide a member on its group as the group store holds it; raises
        CallInterrupted (STORE_UNAVAILABLE) when the store cannot be read or written,
        SHUTTING_DOWN once this process stops."""
        if self._stopping.is_set():
            raise self._interruption()  # its decision could not be waited for any more
        try:
            decision = await self.decisions.apply(sub.key, MemberArrived(sub))
        except StoreError as exc:
            if self._stopping.is_set():  # the decision was cancelled by the stop
                raise self._interruption() from exc
            self._store_failed()
            raise store_unavailable("this member", exc) from exc
        assert isinstance(decision, SubmitDecision)
        ticket = Ticket(decision.disposition)
        if decision.disposition is Disposition.REJECTED:
            ticket.rejection = decision.rejection
            return ticket
        if decision.disposition is Disposition.REPLAYED:
            ticket.replay = decision.replay
            return ticket
        cohort = decision.cohort
        assert cohort is not None
        key = cohort.key
        if self._stopping.is_set():
            # Decided while this process stops: its waiters were interrupted already.
            raise self._interruption()
        if cohort.outcome is not None:
            # It ended in this member's own decision (scored at once), committed already:
            # its answer is there, and nothing of it stays live here.
            deliver(self.judging.retire(key) or [], cohort.outcome)
            ticket.waiter = Waiter.ended(sub.rollout_index, cohort.outcome)
            return ticket
        _, ticket.waiter, _ = self.judging.attach(cohort, sub.rollout_index, on_progress)
        if self.outcomes.ended_lately(key):
            # It may have ended while this member was decided: read its outcome.
            self.outcomes.fetch(key)
        return ticket

    async def view(self, key: CohortKey) -> tuple[CohortRegistry, float]:
        try:
            state = await self.shared.load(key)
        except StoreError as exc:
            self._store_failed()
            raise store_unavailable("this read", exc) from exc
        return self.decisions.scratch(state)

    async def cancel_cohort(self, key: CohortKey, reason: str) -> bool:
        """Fail an active cohort of the shared store, whichever replica holds its members
        or evaluates it: the failure is committed like any end, and its fan-out fails
        every replica's waiters and stops the judging where the lease is held."""
        try:
            decided = await self.decisions.apply(key, Cancelled(key, None, reason))
            return not isinstance(decided, NotActive)
        except StoreError as exc:
            self._store_failed()
            raise store_unavailable("this cancellation", exc) from exc

    # ------------------------------------------------------------------ store health
    async def _watch_store(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.refresh_census()
                available = True
            except StoreError:
                available = False
            if self.shared.shared_by_replicas:
                await self._store_health(available)
            await sleep(self._clock, STORE_CHECK_S if available else SWEEP_S)

    def _store_failed(self) -> None:
        """A read or write of the group store failed. Readiness follows a store shared by
        replicas (Redis: another replica may serve meanwhile); a single process's file
        behind the in-process store does not turn it: its failed writes are counted
        (``store_failures``) and each call they fail is told."""
        if self.store_available and self.shared.shared_by_replicas:
            self.judging.own(self._store_health(False), name="replica-store-down")

    async def _store_health(self, available: bool) -> None:
        if available == self.store_available:
            return
        self.store_available = available
        log.warning("the store %s is %s", self.shared.address, "back" if available else "down")
        if self._on_store_health is not None:
            await self._on_store_health(available)


def _census_of(active: int, evaluating: int, tombstones: int, watermarks: int) -> Census:
    return Census(
        collecting=max(0, active - evaluating),
        evaluating=evaluating,
        tombstones=tombstones,
        watermarks=watermarks,
    )
