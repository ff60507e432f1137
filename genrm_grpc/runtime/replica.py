"""The runtime of one replica among several sharing a Redis store (docs/scaling.md).

Every rule stays in the registry. What changes is where the state it decides on comes
from: for each event a replica reads the group from Redis, restores it into a registry
that holds only that group, applies the event there, and commits the decision's records
with a compare-and-set on the group's version (``genrm_grpc.store.shared``). A refused
commit means another replica changed the group meanwhile: read and decide again. So
members of one group may reach any replica in any order and the outcome is the one a
single process would reach.

- **Batching.** Events for the same cohort key that arrive within ``BATCH_WINDOW_S`` of
  the first, or while a decision about it is in flight, are decided together and
  committed in one round trip: one commit per burst, not per member.
- **No read after its own commit.** The state a replica's commit leaves is kept (the
  version read plus one, the registry with the decisions applied) and the next burst
  for that key is decided on it without a read. A commit still checks the version; a
  decision that writes nothing checks it with one ``GET`` first. A key another replica
  wrote in between is read before every later decision.
- **Waiters** stay on the replica that holds the call. An outcome is committed to a
  mailbox key and its cohort's key published on the replicas' channel in the same
  script; every replica subscribed reads the outcomes its waiters need, and reads
  them all again after it (re)subscribes, so a message lost while disconnected costs
  nothing.
- **Evaluation** belongs to the replica whose commit froze the cohort; it holds the
  cohort's evaluation lease and renews it every ``replica_lease_s``/3. Its journal
  writes and its final commit are fenced by that lease. When the lease expires (the
  replica died, paused or lost Redis) any replica claims it, reads the cohort and its
  journal, and judges only the passes the journal lacks.
- **Gauges** of what the deployment holds (cohorts by phase, tombstones, watermarks)
  are read from the shared counts and indexes every ``STORE_CHECK_S``, with the check
  that Redis answers; every replica reports the deployment's figures.
- **Deadlines** live in one sorted set; every replica looks for due ones every
  ``SWEEP_S``, and the version check lets exactly one of them end the cohort.
- ``judge_max_concurrency`` bounds each replica's judge calls, not the deployment's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from genrm_grpc.cohort.model import (
    Cohort,
    CohortKey,
    Completed,
    Phase,
    Reason,
    Submission,
    Tombstone,
)
from genrm_grpc.cohort.phases import Event as PhaseEvent
from genrm_grpc.cohort.phases import allows
from genrm_grpc.cohort.records import (
    CohortRecord,
    MemberRecord,
    Record,
    Recovered,
    RecoveredCohort,
    VerdictRecord,
)
from genrm_grpc.cohort.registry import CohortRegistry, Disposition, Ended, SubmitDecision
from genrm_grpc.judge.client import JudgeFailedError
from genrm_grpc.observability.hooks import RuntimeObserver
from genrm_grpc.runtime.clock import WallClock
from genrm_grpc.runtime.engine import CohortRuntime
from genrm_grpc.runtime.live import (
    START_SLICE,
    CallInterrupted,
    Census,
    JudgeBackend,
    Live,
    ProgressCallback,
    RuntimeView,
    Ticket,
    Waiter,
    all_or_first_error,
    deliver,
    interrupt,
    store_unavailable,
)
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.memory import MemoryStore, StoreView
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.shared import GroupState, SharedGroups

log = logging.getLogger(__name__)

#: How often each replica looks for due deadlines and orphaned evaluations.
SWEEP_S = 0.25
#: Group states a replica keeps from its own commits, and keys it saw others write.
STATE_CACHE = 1024
#: How long the first event for a cohort waits for others before it is decided.
BATCH_WINDOW_S = 0.002
#: How often a replica checks that Redis answers (health) while it does.
STORE_CHECK_S = 1.0
#: A commit refused this many times in a row (the group kept changing) fails the call.
MAX_COMMIT_ATTEMPTS = 64
#: Keys of cohorts that ended recently, to catch an end published during a decision.
RECENT_ENDS = 4096
#: How often a replica re-reads the outcomes its waiters wait for, whatever the channel
#: said: the channel is at-most-once, this bounds how long a lost message can delay one.
RECHECK_S = 5.0


class ReplicaView(RuntimeView, StoreView, Protocol):
    @property
    def cohort_collection_timeout_s(self) -> float: ...
    @property
    def cohort_evaluation_timeout_s(self) -> float: ...
    @property
    def max_active_cohorts(self) -> int: ...
    @property
    def max_active_cohorts_per_principal(self) -> int | None: ...
    @property
    def replica_lease_s(self) -> float: ...


class _Stale:
    """An index entry whose cohort is no longer active."""


_STALE = _Stale()

Decision = SubmitDecision | Ended | None
Event = Callable[[CohortRegistry, float], Decision | _Stale]


@dataclass(eq=False)
class _Op:
    event: Event
    future: asyncio.Future[Decision | _Stale]


class ReplicaRuntime(CohortRuntime):
    def __init__(
        self,
        registry: CohortRegistry,
        judge: JudgeBackend,
        config: ReplicaView,
        *,
        shared: SharedGroups,
        observer: RuntimeObserver | None = None,
        judge_identity: dict[str, object] | None = None,
        on_store_health: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            registry,
            judge,
            config,
            clock=WallClock(),
            observer=observer,
            store=shared.store,
            judge_identity=judge_identity,
        )
        self.replica_config = config
        self.shared = shared
        self.store_available = True
        self._on_store_health = on_store_health
        self._queues: dict[CohortKey, list[_Op]] = {}
        # The group state of this replica's last commit per key, to decide the next event
        # on without reading it (bounded; keys other replicas also write are not kept).
        self._states: OrderedDict[CohortKey, tuple[GroupState, CohortRegistry]] = OrderedDict()
        self._shared_keys: OrderedDict[CohortKey, None] = OrderedDict()
        self._recent_ends: OrderedDict[CohortKey, None] = OrderedDict()
        self._to_fetch: set[CohortKey] = set()
        self._fetcher: asyncio.Task[None] | None = None
        self._evaluating_here: set[CohortKey] = set()
        #: Collecting cohorts judged here eagerly: set when the channel says one grew.
        self._growth: dict[CohortKey, asyncio.Event] = {}
        self._stopping = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self.takeovers = 0
        self.leases_lost = 0
        #: The deployment's counts as the store watcher last read them (STORE_CHECK_S).
        self._census = Census()

    # ------------------------------------------------------------------ life cycle
    async def open(self) -> int:
        """Reach Redis (RedisStartupError naming it when unreachable) and start the
        replica's background work. Nothing is read back: cohorts live in Redis, and
        orphaned evaluations and due deadlines are picked up by the sweeps."""
        await self.shared.connect()
        await self.shared.store.start()
        loop = asyncio.get_running_loop()
        for coro, name in (
            (
                self.shared.listen(
                    self._on_ended,
                    self._resubscribed,
                    stopping=self._stopping,
                    on_grown=self._on_grown,
                ),
                "replica-listen",
            ),
            (self._sweep(), "replica-sweep"),
            (self._watch_store(), "replica-store-health"),
        ):
            self._background.append(loop.create_task(coro, name=name))
        return 0

    async def shutdown(self, grace_s: float) -> None:
        """Drain: refuse new cohorts, let evaluations run for ``grace_s``, hand the rest
        over to the other replicas (their leases are released), interrupt waiters."""
        self.registry.start_draining()
        await self._grace(grace_s)
        self._stopping.set()
        handoffs = []
        for key in list(self._evaluating_here):
            live = self._live.get(key)
            if live is not None and live.eval_task is not None:
                live.eval_task.cancel()
            if live is not None and isinstance(live.lease, Lease):
                handoffs.append(self._hand_off(key, live.lease))
        await asyncio.gather(*handoffs, return_exceptions=True)
        interrupted = CallInterrupted(
            Reason.SHUTTING_DOWN,
            "this replica is shutting down; the cohort goes on in the shared store: resend "
            "the identical member (to another replica) to reattach",
        )
        for live in list(self._live.values()):
            waiters = [w for ws in live.waiters.values() for w in ws]
            live.waiters.clear()
            interrupt(waiters, interrupted)
        self._live.clear()
        for task in [*self._background, *self._owned]:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.drain_tasks()
        await self.flush()

    async def _hand_off(self, key: CohortKey, lease: Lease) -> None:
        try:
            await self.shared.release(key, lease)
        except StoreError as exc:
            log.warning("could not hand evaluation of %s over (%s); its lease expires", key, exc)

    async def flush(self) -> None:
        return None

    def stats(self) -> dict[str, int]:
        stats = super().stats()
        shared = self.shared.stats
        stats.update(
            # The deployment's active cohorts as this replica last read them (the shared
            # counts); this process's registry holds none.
            active_cohorts=self.shared.stats.active_seen,
            evaluating_here=len(self._evaluating_here),
            takeovers=shared.takeovers,
            leases_lost=shared.leases_lost,
            lease_renewals=shared.renewals,
            group_commits=shared.commits,
            commit_conflicts=shared.conflicts,
            store_available=int(self.store_available),
        )
        return stats

    def census(self) -> Census:
        """The whole deployment's counts (every replica reports the same, a second old
        at most): this process's registry holds one group at a time, and none between."""
        return self._census

    async def refresh_census(self) -> Census:
        """Read the deployment's counts now (one round trip; StoreError when Redis is down)."""
        active, evaluating, tombstones, watermarks = await self.shared.census(time.time())
        self._census = Census(
            collecting=max(0, active - evaluating),
            evaluating=evaluating,
            tombstones=tombstones,
            watermarks=watermarks,
        )
        return self._census

    # ------------------------------------------------------------------ deciding
    def _group_registry(self) -> CohortRegistry:
        """An empty registry, to hold one group restored from Redis."""
        return CohortRegistry(self.replica_config, MemoryStore(self.replica_config))

    def _scratch(self, state: GroupState) -> tuple[CohortRegistry, float]:
        """A registry holding only ``state``'s group, and the wall-clock ``now``."""
        now = time.time()
        registry = self._group_registry()
        registry.restore(state.recovered, now)
        here = len(state.recovered.cohorts)
        registry.count_elsewhere(
            max(0, state.active_total - here),
            {state.key.principal: max(0, state.active_principal - here)},
        )
        if self.registry.draining:
            registry.start_draining()
        return registry, now

    async def _apply(self, key: CohortKey, event: Event) -> Decision | _Stale:
        """Decide ``event`` on the group of ``key`` as Redis holds it, and commit it.

        Events for one key queue while a decision about it is in flight and are decided
        together next time (one read, one commit). Raises StoreError.
        """
        op = _Op(event, asyncio.get_running_loop().create_future())
        queue = self._queues.get(key)
        if queue is not None:
            queue.append(op)
        else:
            self._queues[key] = [op]
            self._own(self._drain(key), name=f"decide {key}")
        return await op.future

    async def _drain(self, key: CohortKey) -> None:
        # A group's members arrive over a few loop turns (one gRPC call each): wait a
        # moment before the first read so that they are decided and committed together.
        await asyncio.sleep(BATCH_WINDOW_S)
        while True:
            ops = self._queues.get(key)
            if not ops:
                self._queues.pop(key, None)
                return
            self._queues[key] = []
            try:
                await self._decide(key, ops, None)
            except BaseException as exc:
                for op in ops:
                    if not op.future.done():
                        op.future.set_exception(
                            exc if isinstance(exc, Exception) else StoreError("cancelled")
                        )
                        op.future.exception()
                if not isinstance(exc, Exception):
                    self._queues.pop(key, None)
                    raise

    async def _decide(self, key: CohortKey, ops: list[_Op], fence: Lease | None) -> bool:
        """Read, decide every op, commit; again while the group changed underneath.

        Returns False when ``fence`` was no longer the evaluation's lease (nothing written).
        """
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            state, registry, now, cached = await self._state_of(key)
            done = _decide_ops(key, ops, registry, now)
            # Nothing to commit, so no version check: make sure the state decided on is
            # still the group's (an answer from a stale state would be wrong).
            if not done.records and cached and await self.shared.version(key) != state.version:
                self._unshare(key)
                continue
            token = 0
            started = [
                r.key
                for r in done.records
                if isinstance(r, CohortRecord) and r.key not in state.active_keys
            ]
            collect: CohortKey | None = None
            if done.records:
                collect, grown = self._eagerly(done.records, started, done.ended, done.frozen)
                committed = await self.shared.commit(
                    state,
                    done.records,
                    ended=[_mailbox(cohort, now) for cohort in done.ended],
                    evaluate=done.frozen.key if done.frozen is not None else None,
                    collect=collect,
                    grown=grown,
                    fence=fence,
                )
                if committed.lease_lost:
                    return False
                if not committed.written:
                    if cached:
                        self._unshare(key)
                    await asyncio.sleep(random.uniform(0, 0.001 * min(attempt + 1, 20)))
                    continue
                token = committed.token
                state = dataclasses.replace(state, version=str(int(state.version) + 1))
            self._keep_state(key, state, registry, done)
            self._carry_out(done, started, now)
            evaluate = done.frozen.key if done.frozen is not None else collect
            if token and evaluate is not None:
                # Frozen here, or (eager) created here: judged here, wherever members arrive.
                self._evaluate_here(evaluate, self.shared.lease_for(evaluate, token))
            _answer(ops, done.decisions)
            return True
        raise StoreError(
            f"cohort {key}: its group changed under {MAX_COMMIT_ATTEMPTS} decisions in a row"
        )

    async def _state_of(self, key: CohortKey) -> tuple[GroupState, CohortRegistry, float, bool]:
        """The group to decide on, in a one-group registry; True when it is the state this
        replica's own last commit left (no read: should another replica have changed the
        group since, the version check refuses the commit and the group is read)."""
        cached = self._states.pop(key, None)
        if cached is not None:
            state, registry = cached
            now = time.time()
            if self.registry.draining:
                registry.start_draining()
        else:
            state = await self.shared.load(key)
            registry, now = self._scratch(state)
        state = dataclasses.replace(
            state, known_active=frozenset(c.key for c in registry.active_cohorts())
        )
        return state, registry, now, cached is not None

    def _keep_state(
        self, key: CohortKey, state: GroupState, registry: CohortRegistry, done: _Decided
    ) -> None:
        """Remember the committed state for the next decision on ``key`` (no read then),
        unless other replicas write the group too or a decision raised."""
        if key in self._shared_keys or any(isinstance(r, Exception) for r in done.decisions):
            return
        self._states[key] = (state, registry)
        if len(self._states) > STATE_CACHE:
            self._states.popitem(last=False)

    def _carry_out(self, done: _Decided, started: list[CohortKey], now: float) -> None:
        """What a committed decision means here: started cohorts counted, ended ones
        logged and handed to this replica's waiters."""
        for started_key in dict.fromkeys(started):
            self._observer.cohort_started(started_key)
        for cohort in done.ended:
            assert cohort.outcome is not None
            self._log_outcome(cohort, cohort.outcome, self._waiting(cohort.key))
            self._end_here(cohort.key, _mailbox(cohort, now))

    def _eagerly(
        self,
        records: list[Record],
        started: list[CohortKey],
        ended: list[Cohort],
        frozen: Cohort | None,
    ) -> tuple[CohortKey | None, list[CohortKey]]:
        """Eager judging: the cohort whose lease a commit takes at creation (None when
        the commit freezes it, or judging waits for the whole group), and the cohorts
        it grows, to announce to the replica judging them."""
        if self.config.judge_schedule != "eager":
            return None, []
        gone = {cohort.key for cohort in ended}
        alive = [key for key in started if key not in gone]
        collect = alive[-1] if alive and frozen is None else None
        grown = {r.key: None for r in records if isinstance(r, MemberRecord)}
        if frozen is not None:
            grown[frozen.key] = None
        return collect, list(grown)

    def _unshare(self, key: CohortKey) -> None:
        """Another replica writes this group too: read it before every decision."""
        self._shared_keys[key] = None
        if len(self._shared_keys) > STATE_CACHE:
            self._shared_keys.popitem(last=False)

    def _waiting(self, key: CohortKey) -> int:
        live = self._live.get(key)
        return 0 if live is None else sum(len(w) for w in live.waiters.values())

    # ------------------------------------------------------------------ API
    def decide(self, sub: Submission, *, on_progress: ProgressCallback | None = None) -> Ticket:
        raise RuntimeError("a replica decides after reading its group: await submit")

    async def submit(
        self, sub: Submission, *, on_progress: ProgressCallback | None = None
    ) -> Ticket:
        """Decide a member on its group as Redis holds it; raises CallInterrupted
        (STORE_UNAVAILABLE) when Redis cannot be read or written."""
        try:
            decision = await self._apply(sub.key, lambda reg, now: reg.submit(sub, now))
        except StoreError as exc:
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
        live = self._live.get(key)
        if live is None:
            live = Live(cohort=cohort)
            self._live[key] = live
        waiter = Waiter(live, sub.rollout_index, on_progress)
        live.waiters.setdefault(sub.rollout_index, set()).add(waiter)
        ticket.waiter = waiter
        if key in self._recent_ends:
            # It may have ended while this member was decided: read its outcome.
            self._fetch(key)
        return ticket

    async def view(self, key: CohortKey) -> tuple[CohortRegistry, float]:
        try:
            state = await self.shared.load(key)
        except StoreError as exc:
            self._store_failed()
            raise store_unavailable("this read", exc) from exc
        return self._scratch(state)

    async def cancel_cohort(self, key: CohortKey, reason: str) -> bool:
        """Fail an active cohort of the shared store, whichever replica holds its members
        or evaluates it: the failure is committed like any end, and its fan-out fails
        every replica's waiters and stops the judging where the lease is held."""

        def event(reg: CohortRegistry, now: float) -> Decision | _Stale:
            cohort = reg.active(key)
            return _STALE if cohort is None else reg.fail(cohort, reason, now)

        try:
            return not isinstance(await self._apply(key, event), _Stale)
        except StoreError as exc:
            self._store_failed()
            raise store_unavailable("this cancellation", exc) from exc

    # ------------------------------------------------------------------ outcomes
    def _end_here(self, key: CohortKey, tomb: Tombstone) -> None:
        """Hand an ended cohort's outcome to this replica's waiters; stop its work here."""
        live = self._live.get(key)
        if live is None:
            return
        if tomb.finished_at < live.cohort.created_at:
            return  # an earlier cohort under the same (legacy) key
        del self._live[key]
        waiters = [w for ws in live.waiters.values() for w in ws]
        live.waiters.clear()
        current = asyncio.current_task()
        for task in [*live.pair_tasks.values(), live.eval_task]:
            if task is not None and task is not current and not task.done():
                task.cancel()
        live.pair_tasks.clear()
        self._resume.drop(key)
        deliver(waiters, tomb.outcome)

    def _on_ended(self, key: CohortKey) -> None:
        self._recent_ends[key] = None
        if len(self._recent_ends) > RECENT_ENDS:
            self._recent_ends.popitem(last=False)
        if key in self._live:
            self._fetch(key)

    def _on_grown(self, key: CohortKey) -> None:
        grew = self._growth.get(key)
        if grew is not None:
            grew.set()

    async def _resubscribed(self) -> None:
        # Messages published while this replica was not subscribed are gone: read every
        # outcome it waits for, and forget cohorts nobody here waits for any more.
        for key, live in list(self._live.items()):
            if not live.waiters and key not in self._evaluating_here:
                del self._live[key]
            else:
                self._fetch(key)
        for grew in self._growth.values():
            grew.set()  # a collecting cohort judged here re-reads its group

    def _fetch(self, key: CohortKey) -> None:
        self._to_fetch.add(key)
        if self._fetcher is None or self._fetcher.done():
            self._fetcher = self._own(self._fetch_outcomes(), name="replica-outcomes")

    async def _fetch_outcomes(self) -> None:
        while self._to_fetch and not self._stopping.is_set():
            keys, self._to_fetch = self._to_fetch, set()
            try:
                found = await self.shared.outcomes(keys)
            except StoreError as exc:
                log.warning("could not read outcomes (%s); trying again", exc)
                self._to_fetch |= keys
                await asyncio.sleep(SWEEP_S)
                continue
            for key, tomb in found.items():
                self._end_here(key, tomb)

    # ------------------------------------------------------------------ evaluation
    def _evaluate_here(self, key: CohortKey, lease: Lease) -> None:
        if key in self._evaluating_here:
            return
        self._evaluating_here.add(key)
        self._evaluating += 1
        self._no_evaluations.clear()
        task = self._own(self._evaluation(key, lease), name=f"evaluate {key}")

        def done(_: asyncio.Task[None]) -> None:
            self._evaluating_here.discard(key)
            self._evaluation_ended()

        task.add_done_callback(done)

    def _adopt(self, key: CohortKey, entry: RecoveredCohort) -> Live:
        """This replica's live state of ``key`` as ``entry`` holds it, judged from here."""
        (cohort,) = self._group_registry().restore(Recovered(cohorts=(entry,)), time.time())
        live = self._live.get(key)
        if live is None:
            live = Live(cohort=cohort)
            self._live[key] = live
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
                self._resume.extend(verdicts)
                live = self._adopt(key, entry)
                for slot in sorted(live.cohort.members):
                    if slot not in live.durable_slots:  # stored: a restart would see it
                        live.durable_slots.add(slot)
                        self._start_ready_pairs(live, slot)
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
            self._resume.extend(verdicts)
            event = await self._judged(key, live)
            # The verdicts first, then the outcome: a commit that ends the cohort drops
            # its lease, and a journal write arriving after it would be refused (and a
            # later attempt of the group could not reuse that verdict).
            await asyncio.gather(*live.journal_writes, return_exceptions=True)
            live.journal_writes.clear()
            op = _Op(event, asyncio.get_running_loop().create_future())
            current = live.lease if isinstance(live.lease, Lease) else lease
            if not await self._decide(key, [op], current):
                log.warning("evaluation of %s was taken over; its result is dropped", key)
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
            self._resume.drop(key)

    def _hold(self, live: Live, key: CohortKey, lease: Lease) -> asyncio.Task[None]:
        """Judge ``key`` under ``lease`` from here, renewing it until the task is cancelled."""
        live.lease = lease
        return self._own(self._keep_lease(live, key), name=f"lease {key}")

    async def _judged(self, key: CohortKey, live: Live) -> Event:
        """Every pass of the frozen cohort judged (or resumed, or reused): the event that
        ends its evaluation, masked when the judge failed."""
        cohort = live.cohort
        tasks = []
        for job in self._plan.all_passes(cohort.group_size):
            tasks.append(self._start_pair(live, job))
            if len(tasks) % START_SLICE == 0:
                await asyncio.sleep(0)
        try:
            results = await all_or_first_error(tasks)
        except JudgeFailedError as exc:
            reason, reused, resumed = exc.reason, live.reused, live.resumed

            def failed(reg: CohortRegistry, now: float) -> Decision:
                active = reg.active(key)
                if active is None:
                    return None
                return reg.judge_failed(active, reason, now, reused=reused, resumed=resumed)

            return failed
        try:
            outcome: Completed | str = self._score(cohort, results, live)
        except Exception as exc:
            log.exception("aggregation of cohort %s failed", key)
            outcome = f"aggregation failed: {exc}"

        def finished(reg: CohortRegistry, now: float) -> Decision:
            active = reg.active(key)
            if active is None:
                return None
            if isinstance(outcome, str):
                return reg.aggregation_failed(active, outcome, now)
            return reg.evaluation_finished(active, outcome, now)

        return finished

    async def _fail_evaluation(self, key: CohortKey, reason: str, lease: Lease) -> None:
        def event(reg: CohortRegistry, now: float) -> Decision:
            active = reg.active(key)
            return None if active is None else reg.fail(active, reason, now)

        live = self._live.get(key)
        current = live.lease if live is not None and isinstance(live.lease, Lease) else lease
        op = _Op(event, asyncio.get_running_loop().create_future())
        try:
            await self._decide(key, [op], current)
        except StoreError as exc:
            log.warning("could not record the failure of %s (%s); its lease expires", key, exc)

    async def _keep_lease(self, live: Live, key: CohortKey) -> None:
        """Renew the evaluation lease every third of its life; stop the evaluation if lost."""
        period = self.shared.lease_s / 3
        while True:
            await asyncio.sleep(period)
            lease = live.lease
            if not isinstance(lease, Lease):
                return
            try:
                renewed = await self.shared.renew(key, lease)
            except StoreError:
                self._store_failed()
                if time.monotonic() < lease.valid_until:
                    continue
                renewed = None
            if renewed is None:
                self.leases_lost += 1
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

    def _journal(self, live: Live, records: list[Record]) -> None:
        lease = live.lease
        if not isinstance(lease, Lease):
            return  # the lease is gone: whoever took over journals its own passes
        written = self.shared.store.persist(records, lease=lease)
        written.add_done_callback(_journal_written)
        live.journal_writes.append(written)

    # ------------------------------------------------------------------ sweeps
    async def _sweep(self) -> None:
        recheck = time.monotonic() + RECHECK_S
        while not self._stopping.is_set():
            await asyncio.sleep(SWEEP_S * random.uniform(0.8, 1.2))
            if time.monotonic() >= recheck:
                recheck = time.monotonic() + RECHECK_S
                await self._resubscribed()
            try:
                due = await self.shared.due(time.time())
                if due:
                    await asyncio.gather(*(self._deadline(key) for key in due))
                if self.registry.draining:
                    continue
                for key in await self.shared.orphaned(time.time()):
                    if key in self._evaluating_here:
                        continue
                    lease = await self.shared.claim(key)
                    if lease is not None:
                        self.takeovers += 1
                        log.info("took over the evaluation of %s", key)
                        self._evaluate_here(key, lease)
            except StoreError as exc:
                self._store_failed()
                log.debug("sweep failed: %s", exc)

    async def _deadline(self, key: CohortKey) -> None:
        def event(reg: CohortRegistry, now: float) -> Decision | _Stale:
            cohort = reg.active(key)
            if cohort is None:
                return _STALE
            if cohort.phase is Phase.COLLECTING:
                return reg.collection_deadline(cohort, now)
            return reg.evaluation_deadline(cohort, now)

        if isinstance(await self._apply(key, event), _Stale):
            await self.shared.forget(key)

    async def _watch_store(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.refresh_census()
                available = True
            except StoreError:
                available = False
            await self._store_health(available)
            await asyncio.sleep(STORE_CHECK_S if available else SWEEP_S)

    def _store_failed(self) -> None:
        if self.store_available:
            self._own(self._store_health(False), name="replica-store-down")

    async def _store_health(self, available: bool) -> None:
        if available == self.store_available:
            return
        self.store_available = available
        log.warning("the store %s is %s", self.shared.address, "back" if available else "down")
        if self._on_store_health is not None:
            await self._on_store_health(available)


@dataclass(slots=True)
class _Decided:
    """The ops of one round on one group, decided: each op's result, and what to commit."""

    decisions: list[Decision | _Stale | Exception] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    ended: list[Cohort] = field(default_factory=list)
    frozen: Cohort | None = None


def _decide_ops(key: CohortKey, ops: list[_Op], registry: CohortRegistry, now: float) -> _Decided:
    done = _Decided()
    for op in ops:
        try:
            decision = op.event(registry, now)
        except Exception as exc:  # one member's bug must not fail its neighbours
            log.exception("deciding an event of cohort %s failed", key)
            done.decisions.append(exc)
            continue
        done.decisions.append(decision)
        if decision is None or isinstance(decision, _Stale):
            continue
        done.records.extend(decision.records)
        if isinstance(decision, SubmitDecision):
            done.ended.extend(decision.ended)
            if decision.frozen:
                done.frozen = decision.cohort
        else:
            done.ended.extend(decision)
    return done


def _answer(ops: list[_Op], decisions: list[Decision | _Stale | Exception]) -> None:
    for op, result in zip(ops, decisions, strict=True):
        if op.future.done():
            continue
        if isinstance(result, Exception):
            op.future.set_exception(result)
            op.future.exception()
        else:
            op.future.set_result(result)


def _mailbox(cohort: Cohort, now: float) -> Tombstone:
    """What the outcome mailbox keeps of an ended cohort: its outcome."""
    assert cohort.outcome is not None
    return Tombstone(
        key=cohort.key,
        group_size=cohort.group_size,
        prompt_digest=cohort.prompt_digest,
        digests={},
        outcome=cohort.outcome,
        finished_at=now,
    )


def _journal_written(written: asyncio.Future[None]) -> None:
    if not written.cancelled() and written.exception() is not None:
        log.warning("a journal write failed: %s", written.exception())
