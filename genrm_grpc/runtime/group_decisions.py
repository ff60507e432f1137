"""How a replica decides one group's events: read, decide in a one-group registry,
compare-and-set.

For each burst of events about one cohort key, :class:`GroupDecisions` reads the group
from the shared store (or takes the state its own last commit left), restores it into a
registry holding only that group, applies the events there (the registry decides every
rule), and commits the records with a compare-and-set on the group's version. A refused
commit means another replica changed the group meanwhile: read and decide again. What
a committed decision means for this process (its waiters, its evaluations) is the
runtime's, through the ``committed`` callback; what a round decided, and how each
event's caller gets its answer, is ``runtime/decided.py``.

- **Batching.** Events for the same cohort key that arrive within ``BATCH_WINDOW_S`` of
  the first, or while a decision about it is in flight, are decided together and
  committed in one round trip: one commit per burst, not per member. A 1-member
  group's member, which has no sibling to wait for, is decided at once.
- **No read after its own commit.** The state a replica's commit leaves is kept (the
  version the commit answered, the registry with the decisions applied) and the next burst
  for that key is decided on it without a read. A commit still checks the version; a
  decision that writes nothing checks it with one ``GET`` first. A key another replica
  wrote in between is read before every later decision.
- **No task in process.** On a store that answers in process (``InstantGroups``: the
  single process's), an event that waits for no sibling is decided in its caller's call,
  and a commit to the file behind completes by a callback on the write, which no
  caller's cancellation stops; events for the key meanwhile queue behind it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from genrm_grpc.cohort.clock import Clock
from genrm_grpc.cohort.events import Decision, GroupEvent, MemberArrived, NotActive
from genrm_grpc.cohort.model import Cohort, CohortKey
from genrm_grpc.cohort.records import MemberRecord, Record
from genrm_grpc.cohort.registry import (
    CohortRegistry,
    RegistryView,
)
from genrm_grpc.runtime.decided import Decided, Op, Settle, answer, decide_ops, fail
from genrm_grpc.runtime.group_store import GroupStore, InstantGroups
from genrm_grpc.runtime.live import RuntimeView
from genrm_grpc.store import group_state
from genrm_grpc.store.group_state import GroupState
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.memory import MemoryStore, StoreView
from genrm_grpc.store.records import StoreError

log = logging.getLogger(__name__)
#: Jitter from a generator of its own, not the ``random`` module's shared one: a
#: process that seeds ``random`` for a reproducible run draws the same numbers
#: whether or not a commit was retried.
_JITTER = random.Random()

#: Group states a replica keeps from its own commits, and keys it saw others write.
STATE_CACHE = 1024
#: How long the first event for a cohort waits for others before it is decided.
BATCH_WINDOW_S = 0.002
#: A commit refused this many times in a row (the group kept changing) fails the call.
MAX_COMMIT_ATTEMPTS = 64


class GroupView(RegistryView, RuntimeView, StoreView, Protocol):
    """What a one-group registry and its runtime read (``Settings`` satisfies it)."""


#: What a committed decision means here: (decided, cohorts it started, now, the cohort
#: this replica judges from now on with its lease, or None).
Committed = Callable[[Decided, list[CohortKey], float, tuple[CohortKey, Lease] | None], None]


class Owner(Protocol):
    """Starts a task the runtime owns (cancelled and awaited when it stops)."""

    def __call__(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]: ...


class GroupDecisions:
    def __init__(
        self,
        shared: GroupStore,
        config: GroupView,
        *,
        draining: Callable[[], bool],
        own: Owner,
        committed: Committed,
        clock: Clock,
        settle: Settle | None = None,
        batch_window_s: float | None = None,
    ) -> None:
        """``clock``: the time decisions are made at (wall-clock seconds, what the group
        store's records carry); ``batch_window_s``: the batching window in the event
        loop's time (``BATCH_WINDOW_S`` when None; 0: a decision starts at the next loop
        turn, with whatever queued by then)."""
        self.shared = shared
        self._clock = clock
        self._window = batch_window_s
        self._settle = settle
        self.config = config
        self._draining = draining
        self._own = own
        self._committed = committed
        self._queues: dict[CohortKey, list[Op]] = {}
        # The group state of this replica's last commit per key, to decide the next event
        # on without reading it (bounded; keys other replicas also write are not kept).
        self._states: OrderedDict[CohortKey, tuple[GroupState, CohortRegistry]] = OrderedDict()
        self._shared_keys: OrderedDict[CohortKey, None] = OrderedDict()
        #: The store, when it answers in process (no task for a decision needing no wait).
        self._instant = shared if isinstance(shared, InstantGroups) else None
        self._stopped = False

    async def decide_one(self, key: CohortKey, event: GroupEvent, fence: Lease | None) -> bool:
        """:meth:`decide` one event now (no batching); False when ``fence`` was lost."""
        op = Op(event, asyncio.get_running_loop().create_future())
        return await self.decide(key, [op], fence)

    def pending(self) -> tuple[int, int]:
        """(keys with a decision queued or running, group states kept from commits)."""
        return len(self._queues), len(self._states)

    def group_registry(self) -> CohortRegistry:
        """An empty registry, to hold one group restored from its store; a round takes
        its records at once (``defer_records``)."""
        registry = CohortRegistry(self.config, MemoryStore(self.config))
        registry.defer_records = True
        return registry

    def scratch(self, state: GroupState) -> tuple[CohortRegistry, float]:
        """A registry holding only ``state``'s group, and the clock's ``now``."""
        now = self._clock.now()
        registry = self.group_registry()
        registry.restore(state.recovered, now)
        here = len(state.recovered.cohorts)
        registry.count_elsewhere(
            max(0, state.active_total - here),
            {state.key.principal: max(0, state.active_principal - here)},
        )
        if self._draining():
            registry.start_draining()
        return registry, now

    async def apply(self, key: CohortKey, event: GroupEvent) -> Decision | NotActive:
        """Decide ``event`` on the group of ``key`` as Redis holds it, and commit it.

        Events for one key queue while a decision about it is in flight and are decided
        together next time (one read, one commit). Raises StoreError.
        """
        op = Op(event, asyncio.get_running_loop().create_future())
        queue = self._queues.get(key)
        if queue is not None:
            queue.append(op)
        elif not _waits_for_siblings(event) and self._decided_now(key, op):
            pass  # answered, or answered once the file behind has its commit
        else:
            self._start_drain(key, [op], _waits_for_siblings(event))
        return await op.future

    def _start_drain(self, key: CohortKey, queue: list[Op], window: bool) -> None:
        self._queues[key] = queue
        task = self._own(self._drain(key, window), name=f"decide {key}")
        task.add_done_callback(lambda done: self._never_ran(key, queue, done))

    def stop(self) -> None:
        """The runtime stops: a commit written after this answers nobody and starts
        nothing here (what it wrote is held, as a cancelled decision's is)."""
        self._stopped = True

    def _never_ran(self, key: CohortKey, queue: list[Op], task: asyncio.Task[None]) -> None:
        """A drain cancelled before its first step never runs its body: fail its ops."""
        if task.cancelled() and self._queues.get(key) is queue:
            del self._queues[key]
            fail(queue, StoreError("cancelled"))

    async def _drain(self, key: CohortKey, window: bool) -> None:
        # A group's members arrive over a few loop turns (one gRPC call each): wait a
        # moment before the first read so that they are decided and committed together.
        delay = BATCH_WINDOW_S if self._window is None else self._window
        if window and delay > 0:
            await asyncio.sleep(delay)
        while True:
            ops = self._queues.get(key)
            if not ops:
                self._queues.pop(key, None)
                return
            self._queues[key] = []
            try:
                await self.decide(key, ops, None)
            except BaseException as exc:
                fail(ops, exc)
                if not isinstance(exc, Exception):
                    # Cancelled (the runtime stops): what queued meanwhile fails too, or
                    # its callers would wait for a decision nobody makes any more.
                    fail(self._queues.pop(key, []), exc)
                    raise

    async def decide(self, key: CohortKey, ops: list[Op], fence: Lease | None) -> bool:
        """Read, decide every op, commit; again while the group changed underneath.

        Returns False when ``fence`` was no longer the evaluation's lease (nothing written).
        """
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            state, registry, now, cached = await self._state_of(key)
            done = self._round(key, ops, state, registry, now, cached)
            if not done.decided.records:
                # Nothing to commit, so no version check: make sure the state decided on
                # is still the group's (an answer from a stale state would be wrong).
                if cached and await self.shared.version(key) != state.version:
                    self._unshare(key)
                    continue
                self._finish(done, None)
                return True
            committed = await self.shared.commit(state, done.decided.records, **done.writes(fence))
            if committed.lease_lost:
                return False
            if not committed.written:
                if cached:
                    self._unshare(key)
                await asyncio.sleep(_JITTER.uniform(0, 0.001 * min(attempt + 1, 20)))
                continue
            self._finish(done, committed)
            return True
        raise StoreError(
            f"cohort {key}: its group changed under {MAX_COMMIT_ATTEMPTS} decisions in a row"
        )

    def _round(
        self,
        key: CohortKey,
        ops: list[Op],
        state: GroupState,
        registry: CohortRegistry,
        now: float,
        cached: bool,
    ) -> _Round:
        """Decide ``ops`` on ``registry`` (the group as ``state`` holds it), and what to
        commit of it."""
        decided = decide_ops(key, ops, registry, now, self._settle)
        started = decided.started(state.active_keys)
        collect: CohortKey | None = None
        grown: list[CohortKey] = []
        if decided.records:
            collect, grown = self._eagerly(decided.records, started, decided.ended, decided.frozen)
        return _Round(key, ops, state, registry, now, cached, decided, started, collect, grown)

    def _decided_now(self, key: CohortKey, op: Op) -> bool:
        """Decide ``op`` without a task or a wait, on a store that answers at once (the
        in-process one): False when it cannot be (a commit of the group is being
        written, or the group changed), and a drain decides it instead. With a file
        behind, the op is answered once its commit is written; events for the key
        meanwhile queue behind it, as behind a drain."""
        instant = self._instant
        if instant is None:
            return False
        cached = self._states.pop(key, None)
        if cached is not None:
            state, registry, now = self._cached(*cached)
        else:
            loaded = instant.load_now(key)
            if loaded is None:
                return False
            state = loaded
            registry, now = self.scratch(state)
        done = self._round(key, [op], state, registry, now, cached is not None)
        if not done.decided.records:
            if done.cached and instant.version_now(key) != state.version:
                self._unshare(key)
                return False
            self._finish(done, None)
            return True
        begun = instant.begin_commit(state, done.decided.records, **done.writes(None))
        if isinstance(begun, group_state.Committed):
            if not begun.written:
                if done.cached:
                    self._unshare(key)
                return False
            self._finish(done, begun)
            return True
        self._queues[key] = []
        begun.add_done_callback(lambda written: self._written(done, written))
        return True

    def _written(self, done: _Round, written: asyncio.Future[group_state.Committed]) -> None:
        """A commit begun by :meth:`_decided_now` is written (or failed): answer it, and
        hand what queued meanwhile to a drain."""
        queued = self._queues.pop(done.key, [])
        error = written.exception() if not written.cancelled() else StoreError("cancelled")
        if self._stopped:
            fail([*done.ops, *queued], StoreError("the runtime stopped"))
            return
        try:
            if error is not None:
                fail(done.ops, error)
            else:
                self._finish(done, written.result())
        except Exception as exc:  # a callback has no caller to raise to: its ops get it
            log.exception("finishing a decision of cohort %s failed", done.key)
            fail(done.ops, exc)
        if queued:
            self._start_drain(done.key, queued, False)

    def _finish(self, done: _Round, committed: group_state.Committed | None) -> None:
        """What a decision means once its commit is in (None: it wrote nothing)."""
        decided = done.decided
        token = 0
        state = done.state
        if committed is not None:
            token = committed.token
            state = state.at_version(committed.version)
        self._keep_state(done.key, state, done.registry, decided)
        evaluate = decided.frozen.key if decided.frozen is not None else done.collect
        judge_here = None
        if token and evaluate is not None:
            # Frozen here, or (eager) created here: judged here, wherever members arrive.
            judge_here = (evaluate, self.shared.lease_for(evaluate, token))
        self._committed(decided, done.started, done.now, judge_here)
        answer(done.ops, decided.decisions)

    async def _state_of(self, key: CohortKey) -> tuple[GroupState, CohortRegistry, float, bool]:
        """The group to decide on, in a one-group registry; True when it is the state this
        replica's own last commit left (no read: should another replica have changed the
        group since, the version check refuses the commit and the group is read)."""
        cached = self._states.pop(key, None)
        if cached is not None:
            state, registry, now = self._cached(*cached)
        else:
            state = await self.shared.load(key)
            registry, now = self.scratch(state)
        return state, registry, now, cached is not None

    def _cached(
        self, state: GroupState, registry: CohortRegistry
    ) -> tuple[GroupState, CohortRegistry, float]:
        """The state of this replica's own last commit, to decide on again: its active
        cohorts are the registry's (a read's are those it holds)."""
        if self._draining():
            registry.start_draining()
        state = state.knowing(frozenset(c.key for c in registry.active_cohorts()))
        return state, registry, self._clock.now()

    def _keep_state(
        self, key: CohortKey, state: GroupState, registry: CohortRegistry, done: Decided
    ) -> None:
        """Remember the committed state for the next decision on ``key`` (no read then),
        unless other replicas write the group too, a decision raised, or the group holds
        no active cohort any more (a later event, a resend, is rare: it reads)."""
        if key in self._shared_keys or any(isinstance(r, Exception) for r in done.decisions):
            return
        if not registry.active_count():
            return
        self._states[key] = (state, registry)
        if len(self._states) > STATE_CACHE:
            self._states.popitem(last=False)

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


@dataclass(slots=True)
class _Round:
    """One decision on one group: what it was decided on, and what it decided."""

    key: CohortKey
    ops: list[Op]
    state: GroupState
    registry: CohortRegistry
    now: float
    #: Decided on the state this process's own last commit left (no read).
    cached: bool
    decided: Decided
    started: list[CohortKey]
    #: Eager judging: the cohort whose lease the commit takes at creation.
    collect: CohortKey | None
    grown: list[CohortKey]

    def writes(self, fence: Lease | None) -> dict[str, Any]:
        """The commit's arguments besides the state and the records."""
        decided = self.decided
        return {
            "ended": decided.mailboxes(self.now),
            "evaluate": decided.frozen.key if decided.frozen is not None else None,
            "collect": self.collect,
            "grown": self.grown,
            "fence": fence,
        }


def _waits_for_siblings(event: GroupEvent) -> bool:
    """Whether a decision starting with ``event`` waits ``BATCH_WINDOW_S`` for the
    group's other members: not for a 1-member group's (it has none)."""
    return not (isinstance(event, MemberArrived) and event.sub.group_size == 1)
