"""The group store of one process: the replicas' seam with nothing shared.

``runtime/replica.py`` decides every event on its group as a ``GroupStore`` holds it
(read, decide in a one-group registry, compare-and-set, fan out). :class:`LocalGroups`
is that store in this process's dicts (``genrm_grpc.store.shared`` is the one over
Redis): a single process is the one-replica case (docs/architecture.md).

What Redis does for the replicas, done here without a round trip:

- **Versions** come from one counter for the whole store, so a group forgotten (it
  holds nothing any more) and created again never repeats a version a decision may
  still hold: a commit on a state read before is refused, never applied by accident.
- **The evaluation lease** is the same lease with a fencing token (tokens come from the
  same kind of store-wide counter, so they only grow). With one process it is always
  its own, renewed as on Redis; a drain releases it.
- **Indexes** (deadlines, evaluations, tombstone and watermark retention, outcome
  mailboxes) are heaps and insertion-ordered dicts: every call costs O(log n) or
  amortised O(1) in what is held, never a walk over it. A deadline is also a timer on
  the store's ``clock`` while a runtime watches (:meth:`LocalGroups.watch_due`): no
  sweep polls for them. A lease's validity counts in a clock of its own
  (``lease_clock``): only this process reads it, so in service it is monotonic, and a
  step of the wall clock (an NTP correction) cannot expire every lease at once and
  have the sweep take over evaluations this process is still running. The evaluation
  index, as Redis's, is filed in the store's clock and is only a hint that
  :meth:`LocalGroups.claim` checks against the lease.
- **Fan-out** is direct: a commit that ends a cohort (or grows one judged eagerly)
  schedules the other listeners' callbacks on the loop, after the commit returned, as
  a message on the Redis channel arrives after the script that published it.
- **The journal** (``store``, ``store/local_journal.py``) keeps the passes in an
  in-process index, lease-fenced.
- **Behind it**, a SQLite file (``behind``) or nothing (``memory://``). With a file,
  every commit is written there before it counts: until then nothing of it is held,
  answered or published, and the group's reads wait; a failed write fails the decision
  (``STORE_UNAVAILABLE``) and leaves the group as it was; a write once begun completes
  by callback, whoever stopped waiting. The commits and passes begun in one loop turn
  go to the file as one batch (``durable.TurnBatched``): they succeed or fail together.
  Retention's drops are written like any record.
  At start (:meth:`LocalGroups.connect`) the file's active cohorts, tombstones,
  watermarks and passes are held again; an evaluating cohort is due at once.

Several :class:`LocalGroups` may share one state (``shared_with``): the tests use that
to stand for two replicas of one deployment in one process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence

from genrm_grpc.cohort.clock import Clock
from genrm_grpc.cohort.model import CohortKey, Tombstone
from genrm_grpc.cohort.records import (
    Record,
    Recovered,
    RecoveredCohort,
    TombstoneRecord,
    VerdictRecord,
)
from genrm_grpc.store.clock import WallClock
from genrm_grpc.store.durable import DurableStore, TurnBatched
from genrm_grpc.store.group_state import MAILBOX_TTL_S, Committed, GroupState, SharedStats
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.local_journal import LocalJournal
from genrm_grpc.store.local_state import Group, Held, group_of
from genrm_grpc.store.memory import StoreView
from genrm_grpc.store.records import StoreError


class LocalGroups:
    """One process's groups behind the replicas' seam (module doc)."""

    def __init__(
        self,
        config: StoreView,
        *,
        lease_s: float,
        replica: str | None = None,
        shared_with: LocalGroups | None = None,
        behind: DurableStore | None = None,
        address: str = "memory://",
        clock: Clock | None = None,
        lease_clock: Clock | None = None,
    ) -> None:
        """``behind``: the file every commit is written to before it counts, read back
        by :meth:`connect` (None: nothing outlives the process). ``clock``: the time
        of its deadlines and retention (wall-clock seconds by default: records carry
        it into the file); ``lease_clock``: the time of its evaluation leases
        (``clock`` when None). The store it shares state with decides both when
        ``shared_with`` is given."""
        if shared_with is not None:
            self.state: Held = shared_with.state
        else:
            self.state = Held(config, clock if clock is not None else WallClock(), lease_clock)
        self.clock = self.state.clock
        self.lease_clock = self.state.lease_clock
        self.address = address
        self.lease_s = lease_s
        self.replica = replica or f"{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.stats = SharedStats()
        #: The file behind (None: nothing); what a test or an operator inspects.
        self.behind = behind
        #: Where commits and passes are written: the file, one batch per loop turn.
        self._file = TurnBatched(behind) if behind is not None else None
        self.store = LocalJournal(self, self._file)
        #: Cohorts of one process's store: a drain keeps them for the next process.
        self.shared_by_replicas = False

    async def connect(self) -> int:
        """Open the file behind and hold what it kept; returns the active cohorts read
        back (StoreSchemaError for a file this server cannot use)."""
        if self.behind is None:
            return 0
        recovered = await self.behind.open(self.clock.now())
        self.state.restore(recovered)
        return len(recovered.cohorts)

    async def census(self, now: float) -> tuple[int, int, int, int]:
        state = self.state
        drops = state.retention((), now)
        if drops:  # what expired goes (from the file too), without waiting for a commit
            state.apply(drops)
            if self.behind is not None:
                self.store.persist(drops).add_done_callback(_ignore_failure)
        state.expire_mailboxes(now)
        self.stats.active_seen = state.active_total
        return self.counts_now()

    def counts_now(self) -> tuple[int, int, int, int]:
        """Active cohorts, those evaluating, tombstones and watermarks held now: four
        sizes kept as records apply, read by every scrape (no walk, nothing expired)."""
        state = self.state
        evaluating = len(state.evaluations.at)
        return state.active_total, evaluating, len(state.tombstones), len(state.watermarks)

    # ------------------------------------------------------------------ read
    async def load(self, key: CohortKey) -> GroupState:
        """The group of ``key``: its version, the key's cohort and tombstone, the newest
        attempt's, the watermark, and the active counts (as Redis's ``LOAD``)."""
        await self._settled(key)
        return self._read(key)

    def load_now(self, key: CohortKey) -> GroupState | None:
        """:meth:`load` without waiting: None while a commit of the group is being
        written to the file behind (its version would not count yet)."""
        group = self.state.groups.get(group_of(key))
        if group is not None and group.pending is not None:
            return None
        return self._read(key)

    def _read(self, key: CohortKey) -> GroupState:
        state = self.state
        self.stats.loads += 1
        gid = group_of(key)
        if not state.known(gid):
            # No group holds nothing: no cohort, tombstone or watermark (it is forgotten
            # only once idle), so the read of a new group looks nothing up.
            self.stats.active_seen = state.active_total
            return GroupState(
                key=key,
                version="0",
                recovered=_NOTHING,
                active_total=state.active_total,
                active_principal=state.active_by_principal.get(key.principal, 0),
            )
        now = self.clock.now()
        mark = state.unexpired_watermark(key.group_scope, now)
        keys = [key]
        if mark is not None and mark.attempt != key.attempt:
            keys.append(CohortKey(key.group_id, None, mark.attempt, key.principal))
        cohorts: list[RecoveredCohort] = []
        tombstones: list[TombstoneRecord] = []
        for each in keys:
            active = state.cohorts.get(each)
            entry = active.recovered() if active is not None else None
            if entry is not None:
                cohorts.append(entry)
            tomb = state.unexpired_tombstone(each, now)
            if tomb is not None:
                tombstones.append(tomb)
        self.stats.active_seen = state.active_total
        return GroupState(
            key=key,
            version=str(state.version_of(gid)),
            recovered=Recovered(tuple(cohorts), tuple(tombstones), (mark,) if mark else ()),
            active_total=state.active_total,
            active_principal=state.active_by_principal.get(key.principal, 0),
        )

    async def version(self, key: CohortKey) -> str:
        await self._settled(key)
        return str(self.state.version_of(group_of(key)))

    def version_now(self, key: CohortKey) -> str | None:
        """:meth:`version` without waiting: None while a commit of it is being written."""
        gid = group_of(key)
        group = self.state.groups.get(gid)
        if group is not None and group.pending is not None:
            return None
        return str(self.state.version_of(gid))

    async def _settled(self, key: CohortKey) -> Group | None:
        """``key``'s group once no commit of it is being written (its version counts)."""
        while True:
            group = self.state.groups.get(group_of(key))
            if group is None or group.pending is None:
                return group
            await asyncio.wait({group.pending})  # never cancels the writer's future

    async def load_evaluation(
        self, key: CohortKey
    ) -> tuple[RecoveredCohort | None, list[VerdictRecord]]:
        active = self.state.cohorts.get(key)
        entry = active.recovered() if active is not None else None
        if entry is None:
            return None, []
        return entry, self.state.journal.of_cohort(key)

    async def outcomes(self, keys: Iterable[CohortKey]) -> dict[CohortKey, Tombstone]:
        state = self.state
        now = self.clock.now()
        found: dict[CohortKey, Tombstone] = {}
        for key in keys:
            mailbox = state.unexpired_mailbox(key, now)
            if mailbox is not None:
                found[key] = mailbox
                continue
            tomb = state.unexpired_tombstone(key, now)
            if tomb is not None:
                found[key] = tomb.tombstone
        return found

    async def due(self, now: float, limit: int = 64) -> list[CohortKey]:
        return self.state.deadlines.due(now, limit)

    async def orphaned(self, now: float, limit: int = 16) -> list[CohortKey]:
        """Evaluations filed as due by ``now`` (the store's clock, as on Redis): a hint
        that :meth:`claim` checks against the lease itself."""
        return self.state.evaluations.due(now, limit)

    async def forget(self, key: CohortKey) -> None:
        self.state.drop_deadline(key)
        self.state.evaluations.remove(key)

    def watch_due(self, on_due: Callable[[CohortKey], None]) -> Callable[[], None] | None:
        """Deadlines here are the clock's timers: ``on_due(key)`` when one is due (no
        polling of :meth:`due`); returns what stops it."""
        return self.state.watch_deadlines(on_due)

    def lease_now(self) -> float:
        """Now, in the time a lease's ``valid_until`` counts in (the lease clock)."""
        return self.lease_clock.now()

    async def active_keys(self) -> list[CohortKey]:
        """Every active cohort held (a drain that fails them all walks them once)."""
        return [key for key, active in self.state.cohorts.items() if active.header is not None]

    # ------------------------------------------------------------------ write
    async def commit(
        self,
        state: GroupState,
        records: Sequence[Record],
        *,
        ended: Sequence[Tombstone] = (),
        evaluate: CohortKey | None = None,
        collect: CohortKey | None = None,
        grown: Sequence[CohortKey] = (),
        fence: Lease | None = None,
    ) -> Committed:
        """Write ``records`` if the group is still at the version ``state`` read (the
        arguments as :meth:`genrm_grpc.store.shared.SharedGroups.commit`'s)."""
        begun = self.begin_commit(
            state,
            records,
            ended=ended,
            evaluate=evaluate,
            collect=collect,
            grown=grown,
            fence=fence,
        )
        if isinstance(begun, Committed):
            return begun
        # The write goes on if this wait is cancelled: what it commits is held then.
        await asyncio.wait({begun})
        return begun.result()

    def begin_commit(
        self,
        state: GroupState,
        records: Sequence[Record],
        *,
        ended: Sequence[Tombstone] = (),
        evaluate: CohortKey | None = None,
        collect: CohortKey | None = None,
        grown: Sequence[CohortKey] = (),
        fence: Lease | None = None,
    ) -> Committed | asyncio.Future[Committed]:
        """:meth:`commit` without awaiting: its answer at once when nothing is behind (or
        the version check refuses it), else a future that the file's write resolves
        (StoreError when it failed: nothing of it is held). Nobody's cancellation stops a
        write once begun, and what it wrote is held once it is written."""
        held = self.state
        key = state.key
        group = held.group(key)
        self.stats.commits += 1
        if str(group.version) != state.version:
            self.stats.conflicts += 1
            held.forget_if_idle(key)
            return Committed(False)
        if fence is not None and not self.holds(fence):
            self.stats.leases_lost += 1
            return Committed(False, lease_lost=True)
        now = self.clock.now()
        drops = held.retention(records, now)
        records = [*records, *drops]
        group.version = next(held.versions)
        done = _Commit(self, group, key, records, ended, evaluate, collect, grown, now)
        if self._file is None or not records:
            return done.held()
        written = done.write(self._file)
        # What retention drops goes from memory at once (the file's write follows, and
        # applying it again then changes nothing): else every commit begun before this
        # one is written would drop the same oldest tombstones again, as many times as
        # commits are in flight. The group is pending now, so nothing here forgets it.
        held.apply(drops)
        return written

    def _held(self, commit: _Commit) -> Committed:
        """Hold a commit's records (written to the file behind, where there is one)."""
        held = self.state
        held.apply(commit.records)
        for tomb in commit.ended:
            if not held.has_tombstone(tomb.key):
                # A cohort that left a tombstone is read from it (:meth:`outcomes`);
                # only one that left none (a completed legacy cohort) needs a mailbox.
                held.mailbox(tomb, commit.now + MAILBOX_TTL_S)
        token = 0
        lease_of = commit.evaluate if commit.evaluate is not None else commit.collect
        if lease_of is not None and not held.group(lease_of).lease_held(self.lease_now()):
            token = self._take(lease_of).token
        if commit.evaluate is not None:
            held.evaluations.file(commit.evaluate, commit.now + self.lease_s)
        held.expire_mailboxes(commit.now)
        held.forget_if_idle(commit.key)
        held.publish([tomb.key for tomb in commit.ended], commit.grown, origin=self)
        return Committed(True, token=token, version=str(commit.group.version))

    # ------------------------------------------------------------------ evaluation leases
    def _take(self, key: CohortKey) -> Lease:
        """A new evaluation lease on ``key``'s group, with the next fencing token."""
        lease = self.lease_for(key, next(self.state.tokens))
        self.state.group(key).lease = lease
        return lease

    def holds(self, lease: Lease) -> bool:
        """``lease`` is its group's current evaluation lease."""
        group = self.state.groups.get(lease.scope)
        held = group.lease if group is not None else None
        # By value (token and holder), as on Redis: a renewal changes only its expiry.
        return (
            held is not None and held.valid_until > self.lease_now() and held.value == lease.value
        )

    def lease_for(self, key: CohortKey, token: int, taken_at: float | None = None) -> Lease:
        """This process's lease ``token`` on ``key``'s evaluation, valid for ``lease_s``
        from ``taken_at`` (the lease clock; now when None)."""
        started = self.lease_now() if taken_at is None else taken_at
        scope = group_of(key)
        return Lease(scope, self.replica, token, started + self.lease_s, key=scope)

    async def claim(self, key: CohortKey) -> Lease | None:
        """Take over an evaluation whose lease is gone; None when it is held."""
        if self.state.group(key).lease_held(self.lease_now()):
            return None
        lease = self._take(key)
        self.state.evaluations.file(key, self.clock.now() + self.lease_s)
        self.stats.takeovers += 1
        return lease

    async def renew(self, key: CohortKey, lease: Lease) -> Lease | None:
        """The lease extended by ``lease_s``; None when it is no longer this holder's."""
        if not self.holds(lease):
            self.stats.leases_lost += 1
            return None
        renewed = dataclasses.replace(lease, valid_until=self.lease_now() + self.lease_s)
        self.state.group(key).lease = renewed
        self.state.evaluations.refile(key, self.clock.now() + self.lease_s)
        self.stats.renewals += 1
        return renewed

    async def release(self, key: CohortKey, lease: Lease) -> None:
        """Give an unfinished evaluation to whoever looks next (its entry is due at once)."""
        if self.holds(lease):
            self.state.group(key).lease = None
            self.state.evaluations.refile(key, 0.0)

    # ------------------------------------------------------------------ fan-out
    async def listen(
        self,
        on_ended: Callable[[CohortKey], None],
        on_subscribed: Callable[[], Awaitable[None]],
        *,
        stopping: asyncio.Event,
        on_grown: Callable[[CohortKey], None] | None = None,
    ) -> None:
        """Call ``on_ended`` (``on_grown``) for every cohort a commit ended (grew) until
        ``stopping``: nothing is lost in between, so ``on_subscribed`` runs once. The
        ends of this store's own commits are not told: its runtime has them from its
        commit (``GroupDecisions``' ``committed``)."""
        listener = (self, on_ended, on_grown or _ignore)
        self.state.listeners.append(listener)
        try:
            await on_subscribed()
            await stopping.wait()
        finally:
            self.state.listeners.remove(listener)


_NOTHING = Recovered()


def _ignore(key: CohortKey) -> None:
    return None


def _ignore_failure(written: asyncio.Future[None]) -> None:
    if not written.cancelled():
        written.exception()  # retention tries again at the next census


@dataclasses.dataclass(slots=True)
class _Commit:
    """One commit past its version check: held at once, or once the file wrote it."""

    groups: LocalGroups
    group: Group
    key: CohortKey
    records: list[Record]
    ended: Sequence[Tombstone]
    evaluate: CohortKey | None
    collect: CohortKey | None
    grown: Sequence[CohortKey]
    now: float

    def held(self) -> Committed:
        return self.groups._held(self)

    def write(self, behind: DurableStore) -> asyncio.Future[Committed]:
        """Write to the file behind; the group's reads wait for it meanwhile. Its lease
        is checked before, not again after: with one process the only other claimant is
        this process's own sweep, after ``lease_s`` without a renewal."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Committed] = loop.create_future()
        pending: asyncio.Future[None] = loop.create_future()
        self.group.pending = pending

        def written(write: asyncio.Future[None]) -> None:
            error = write.exception() if not write.cancelled() else StoreError("cancelled")
            outcome: Committed | BaseException
            # Not pending while it is held, so that a group it leaves idle is forgotten;
            # the reads waiting for it run after this callback, on what it holds.
            self.group.pending = None
            try:
                if error is None:
                    outcome = self.held()
                else:
                    self.groups.stats.failures += 1
                    outcome = error
            except Exception as exc:  # never leave the group's reads waiting
                outcome = exc
            pending.set_result(None)
            if answer.cancelled():
                return
            if isinstance(outcome, Committed):
                answer.set_result(outcome)
            else:
                answer.set_exception(outcome)
                answer.exception()  # its caller may have gone (cancelled): no warning

        behind.persist(self.records).add_done_callback(written)
        return answer
