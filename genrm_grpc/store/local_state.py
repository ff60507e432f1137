"""What the in-process group store holds (``genrm_grpc.store.local``), and how it
writes a record: the same effects as the Redis store's ops (``genrm_grpc.store.lua``),
kept in dicts, heaps and insertion-ordered dicts so that nothing walks what is held.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from genrm_grpc.cohort.clock import Clock, TimerHandle
from genrm_grpc.cohort.journal import VerdictJournal
from genrm_grpc.cohort.model import CohortKey, Phase, Tombstone
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    Record,
    Recovered,
    RecoveredCohort,
    TombstoneRecord,
    VerdictRecord,
    WatermarkRecord,
)
from genrm_grpc.store.instant_index import Index
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.memory import (
    RetainedKey,
    StoreView,
    expiry_of,
    record_of,
    retained_key,
    retained_tombstone,
)
from genrm_grpc.store.redis_keys import key_text

#: A group: its scope, or a legacy cohort's own key as text (what a lease's ``scope`` is).
GroupId = str
#: A retained tombstone is one ``bytes``, as memory:// keeps it (``retained_tombstone``:
#: its expiry, then its ``Tombstone.record()``), under a plain key (``retained_key``).
#: A watermark: the instant it expires, then the group's newest attempt, as one
#: ``bytes`` (49 bytes, where a tuple of a float and an int would be 80); ``expiry_of``
#: reads its first field as a tombstone's.
_MARK = struct.Struct("dq")
#: A resting group (:attr:`Held.resting`): its version and tombstone count as one int,
#: ``version * _SPAN + count`` (an int of 32 bytes, where a tuple would be 84).
_SPAN = 1 << 32
#: Past ``max_terminal_cohorts`` retention drops the oldest tombstones until the count
#: is ``bound // EVICTION_CHUNK`` below the bound (64 below the default 4,096; for a bound
#: under 64, down to the bound itself): one commit in 64 drops, the others find nothing
#: due without reading their records. In process, a 1-member SubmitMember at the bound
#: cost ~10 µs more than below it (of ~130); this takes ~4 µs of that back (the drops
#: themselves remain, one per evicted cohort).
EVICTION_CHUNK = 64


def _rest(version: int, count: int) -> int:
    return version * _SPAN + count


def group_of(key: CohortKey) -> GroupId:
    scope = key.group_scope
    return key_text(key) if scope is None else scope


@dataclass(slots=True)
class Active:
    """An active cohort as stored: its header (once written) and its members by slot."""

    header: CohortRecord | None = None
    members: dict[int, MemberRecord] = field(default_factory=dict)

    def recovered(self) -> RecoveredCohort | None:
        if self.header is None:
            return None
        members = tuple(self.members[slot] for slot in sorted(self.members))
        return RecoveredCohort(self.header, members)


@dataclass(slots=True)
class Group:
    version: int = 0
    active: int = 0  # active cohorts with a header
    tombstones: int = 0
    #: The evaluation lease, held until its ``valid_until`` (the store's lease clock).
    lease: Lease | None = None
    #: A commit being written to the file behind: reads wait for it.
    pending: asyncio.Future[None] | None = None

    def busy(self, now: float) -> bool:
        """Holds more than retained state: an active cohort, a write, a lease."""
        return bool(self.active or self.pending or self.lease_held(now))

    def lease_held(self, now: float) -> bool:
        return self.lease is not None and self.lease.valid_until > now


class Held:
    """Everything one in-process deployment holds (module doc).

    A cohort's deadline is a ``clock`` timer while someone watches deadlines
    (:attr:`due_listeners`): one timer per cohort, moved when its deadline is filed at
    another instant, cancelled when it is taken out. A timer that fires tells every
    listener the key is due; the decision it asks for checks the deadline again.
    """

    def __init__(self, config: StoreView, clock: Clock, lease_clock: Clock | None = None) -> None:
        self.clock = clock
        #: What evaluation leases count in (``clock`` when None): only this process
        #: reads them, so a monotonic clock, which a step of the wall clock cannot
        #: expire, in service.
        self.lease_clock = clock if lease_clock is None else lease_clock
        self.max_tombstones = config.max_terminal_cohorts
        #: Groups with an active cohort, a write or a lease (a ``Group`` each).
        self.groups: dict[GroupId, Group] = {}
        #: Groups that hold only retained state (tombstones, a watermark): their version
        #: and tombstone count as one int (``_rest``), so that tens of thousands of
        #: retained groups add no object to a garbage collection (:meth:`_forget_if_idle`).
        self.resting: dict[GroupId, int] = {}
        self.cohorts: dict[CohortKey, Active] = {}
        #: Tombstones and mailboxes hold each outcome as its ``Tombstone.record()``
        #: bytes (with the instant it goes), which the cyclic garbage collector does not
        #: track: tens of thousands retained add nothing to a collection (as memory://).
        #: A tombstone's instant is packed ahead of its record (``retained_tombstone``), under a
        #: plain key; a watermark is its expiry and attempt packed (``_MARK``): nothing
        #: retained is an object the cyclic garbage collector tracks (as memory://).
        self.tombstones: OrderedDict[RetainedKey, bytes] = OrderedDict()
        self.watermarks: OrderedDict[str, bytes] = OrderedDict()
        self.mailboxes: OrderedDict[CohortKey, tuple[bytes, float]] = OrderedDict()
        self.journal = VerdictJournal()
        self.deadlines = Index()
        self.evaluations = Index()
        self.active_total = 0
        self.active_by_principal: dict[str, int] = {}
        self.versions = itertools.count(1)
        self.tokens = itertools.count(1)
        #: (the store listening, its ``on_ended``, its ``on_grown``)
        self.listeners: list[
            tuple[object, Callable[[CohortKey], None], Callable[[CohortKey], None]]
        ] = []
        #: Told when a cohort's deadline is due (its timer fired).
        self.due_listeners: list[Callable[[CohortKey], None]] = []
        self._timers: dict[CohortKey, tuple[float, TimerHandle]] = {}

    def group(self, key: CohortKey) -> Group:
        return self._group(group_of(key))

    def _group(self, gid: GroupId) -> Group:
        group = self.groups.get(gid)
        if group is None:
            version, tombstones = divmod(self.resting.pop(gid, 0), _SPAN)
            group = self.groups[gid] = Group(version=version, tombstones=tombstones)
        return group

    def known(self, gid: GroupId) -> bool:
        """The group holds something (a group that holds nothing is forgotten)."""
        return gid in self.groups or gid in self.resting

    def version_of(self, gid: GroupId) -> int:
        group = self.groups.get(gid)
        if group is not None:
            return group.version
        return self.resting.get(gid, 0) // _SPAN

    def forget_if_idle(self, key: CohortKey) -> None:
        self._forget_if_idle(group_of(key))

    def _forget_if_idle(self, gid: GroupId) -> None:
        """A group with nothing active, written or leased rests: its version and
        tombstone count as one int, while it retains anything; else it is forgotten."""
        group = self.groups.get(gid)
        if group is None or group.busy(self.lease_clock.now()):
            return
        del self.groups[gid]
        if group.tombstones or gid in self.watermarks:
            self.resting[gid] = _rest(group.version, group.tombstones)

    def _count_tombstones(self, gid: GroupId, delta: int) -> None:
        group = self.groups.get(gid)
        if group is not None:
            group.tombstones += delta
            return
        version, count = divmod(self.resting.get(gid, 0), _SPAN)
        count += delta
        if count or gid in self.watermarks:
            self.resting[gid] = _rest(version, count)
        else:
            self.resting.pop(gid, None)

    # ------------------------------------------------------------------ deadlines
    def file_deadline(self, key: CohortKey, instant: float) -> None:
        """``key`` is due at ``instant``: in the index, and a timer when it is watched."""
        self.deadlines.file(key, instant)
        self._arm(key, instant)

    def _arm(self, key: CohortKey, instant: float) -> None:
        armed = self._timers.get(key)
        if armed is not None:
            if armed[0] == instant:
                return  # (a header written again at the same deadline: one timer)
            armed[1].cancel()
            del self._timers[key]
        if self.due_listeners and math.isfinite(instant):
            timer = self.clock.call_at(instant, lambda: self._due(key, instant))
            self._timers[key] = (instant, timer)

    def drop_deadline(self, key: CohortKey) -> None:
        self.deadlines.remove(key)
        armed = self._timers.pop(key, None)
        if armed is not None:
            armed[1].cancel()

    def deadline_timers(self) -> int:
        """Deadline timers armed now (one per cohort at most)."""
        return len(self._timers)

    def _due(self, key: CohortKey, instant: float) -> None:
        armed = self._timers.get(key)
        if armed is not None and armed[0] == instant:
            del self._timers[key]
        if self.deadlines.at.get(key) != instant:
            return  # filed again meanwhile (its own timer tells), or taken out
        for on_due in list(self.due_listeners):
            on_due(key)

    def watch_deadlines(self, on_due: Callable[[CohortKey], None]) -> Callable[[], None]:
        """Call ``on_due(key)`` when a deadline is due, from now (those filed already
        get their timer); returns what stops it."""
        first = not self.due_listeners
        self.due_listeners.append(on_due)
        if first:
            for key, instant in self.deadlines.at.items():
                self._arm(key, instant)

        def stop() -> None:
            if on_due in self.due_listeners:
                self.due_listeners.remove(on_due)
            if not self.due_listeners:
                for _, timer in self._timers.values():
                    timer.cancel()
                self._timers.clear()

        return stop

    def _active(self, key: CohortKey) -> Active:
        active = self.cohorts.get(key)
        if active is None:
            active = self.cohorts[key] = Active()
        return active

    # ------------------------------------------------------------------ records
    def apply(self, records: Sequence[Record]) -> None:
        """Write ``records`` as the Redis store's ops do (``genrm_grpc.store.lua``)."""
        for record in records:
            if isinstance(record, MemberRecord):
                self._active(record.key).members[record.coords.rollout_index] = record
            elif isinstance(record, CohortRecord):
                self._header(record)
            elif isinstance(record, VerdictRecord):
                self.journal.add(record)
            elif isinstance(record, DropCohort):
                self._drop_cohort(record)
            elif isinstance(record, TombstoneRecord):
                self._tombstone(record)
            elif isinstance(record, DropTombstone):
                self._drop_tombstone(record.key)
            elif isinstance(record, WatermarkRecord):
                self._watermark(record)
            elif isinstance(record, DropWatermark):
                self._drop_watermark(record.scope)
            else:
                raise TypeError(f"not a store record: {record!r}")

    def _header(self, record: CohortRecord) -> None:
        key = record.key
        active = self._active(key)
        if active.header is None:
            self.group(key).active += 1
            self._count(key, 1)
        active.header = record
        deadline = record.collection_deadline
        if record.phase is Phase.EVALUATING and record.evaluation_deadline is not None:
            deadline = record.evaluation_deadline
        self.file_deadline(key, deadline)

    def _drop_cohort(self, record: DropCohort) -> None:
        key = record.key
        active = self.cohorts.pop(key, None)
        self.drop_deadline(key)
        self.evaluations.remove(key)
        group = self.group(key)
        group.lease = None
        if active is not None and active.header is not None:
            group.active -= 1
            self._count(key, -1)
        if not record.keep_verdicts:
            self.journal.drop(key)

    def _count(self, key: CohortKey, delta: int) -> None:
        self.active_total += delta
        by = self.active_by_principal
        left = by.get(key.principal, 0) + delta
        if left:
            by[key.principal] = left
        else:
            by.pop(key.principal, None)

    def _tombstone(self, record: TombstoneRecord) -> None:
        tomb = record.tombstone
        key = tomb.key
        plain = retained_key(key)
        if self.tombstones.pop(plain, None) is None:
            self._count_tombstones(group_of(key), 1)
        self.tombstones[plain] = retained_tombstone(record.expires_at, tomb.record())
        if not tomb.masked and tomb.failed is None:
            # As memory:// always did: a completed cohort's verdicts are rarely asked
            # again, and kept they would cost ~100 objects per retained cohort; masked
            # and failed attempts (those a caller retries) keep theirs for reuse.
            self.journal.drop(key)

    def _drop_tombstone(self, key: CohortKey) -> None:
        if self.tombstones.pop(retained_key(key), None) is not None:
            gid = group_of(key)
            self._count_tombstones(gid, -1)
            self._forget_if_idle(gid)
        self.journal.drop(key)

    def has_tombstone(self, key: CohortKey) -> bool:
        return retained_key(key) in self.tombstones

    def _watermark(self, record: WatermarkRecord) -> None:
        marks = self.watermarks
        scope = record.scope
        old = marks.pop(scope, None)
        attempt = record.attempt if old is None else max(_MARK.unpack(old)[1], record.attempt)
        marks[scope] = _MARK.pack(record.expires_at, attempt)
        if not self.known(scope):
            self.resting[scope] = _rest(0, 0)

    def _drop_watermark(self, scope: str) -> None:
        self.watermarks.pop(scope, None)
        if scope in self.groups:
            self._forget_if_idle(scope)
        elif self.resting.get(scope, 0) % _SPAN == 0:
            self.resting.pop(scope, None)

    def retention(self, records: Sequence[Record], now: float) -> list[Record]:
        """What retention drops once ``records`` are written: expired tombstones (with
        their verdicts) and watermarks, and past ``max_terminal_cohorts`` the oldest
        tombstones. Records like any other, so that a file behind writes them too.

        Amortised O(1): the oldest entries come first, and it stops at the first one
        that stays. Past the bound it drops down to ``bound // EVICTION_CHUNK`` below it:
        the bound still holds at every commit, and only the commit that drops looks at
        its records, not each commit at the bound.
        """
        tombs = self.tombstones
        if self._nothing_due(tombs, now, len(records)):
            return []
        written = {retained_key(r.tombstone.key) for r in records if isinstance(r, TombstoneRecord)}
        gone = {retained_key(r.key) for r in records if isinstance(r, DropTombstone)}
        marks = {r.scope for r in records if isinstance(r, WatermarkRecord | DropWatermark)}
        count = len(tombs) + sum(1 for key in written if key not in tombs)
        count -= sum(1 for key in gone if key in tombs and key not in written)
        bound = self.max_tombstones
        keep = bound - bound // EVICTION_CHUNK if count > bound else bound
        drops: list[Record] = []
        for plain, kept in tombs.items():
            if expiry_of(kept) > now and count <= keep:
                break
            if plain in written or plain in gone:
                continue
            drops.append(DropTombstone(CohortKey(*plain)))
            count -= 1
        for scope, mark in self.watermarks.items():
            if expiry_of(mark) > now:
                break
            if scope not in marks:
                drops.append(DropWatermark(scope))
        return drops

    def _nothing_due(
        self, tombs: OrderedDict[RetainedKey, bytes], now: float, written: int
    ) -> bool:
        """Whether retention surely drops nothing: the oldest tombstone and watermark
        are unexpired and even ``written`` more tombstones stay within the bound (what
        most commits find, decided without looking at their records)."""
        if len(tombs) + written > self.max_tombstones:
            return False
        if tombs and expiry_of(next(iter(tombs.values()))) <= now:
            return False
        marks = self.watermarks
        return not marks or expiry_of(next(iter(marks.values()))) > now

    def expire_mailboxes(self, now: float) -> None:
        while self.mailboxes:
            key, (_, until) = next(iter(self.mailboxes.items()))
            if until > now:
                break
            del self.mailboxes[key]

    def restore(self, recovered: Recovered) -> None:
        """Hold what a file behind kept: active cohorts (an evaluating one is due for
        its evaluation at once, with no lease), tombstones, watermarks and verdicts."""
        for entry in recovered.cohorts:
            self.apply([entry.header, *entry.members])
            if entry.header.phase is Phase.EVALUATING:
                self.evaluations.file(entry.header.key, 0.0)
        by_expiry = sorted(recovered.tombstones, key=lambda t: t.expires_at)
        self.apply([*by_expiry, *recovered.watermarks])
        # Only the active cohorts' passes are held (to resume them); reuse asks the file.
        active = {entry.header.key for entry in recovered.cohorts}
        self.journal.extend(v for v in recovered.verdicts if v.cohort in active)

    def unexpired_watermark(self, scope: str | None, now: float) -> WatermarkRecord | None:
        if scope is None:
            return None
        mark = self.watermarks.get(scope)
        if mark is None:
            return None
        expires_at, attempt = _MARK.unpack(mark)
        return WatermarkRecord(scope, attempt, expires_at) if expires_at > now else None

    def unexpired_tombstone(self, key: CohortKey, now: float) -> TombstoneRecord | None:
        kept = self.tombstones.get(retained_key(key))
        if kept is None:
            return None
        expires_at = expiry_of(kept)
        if expires_at <= now:
            return None
        # A copy of the record (a read is rare: a replay, a lookup), which the tombstone
        # then keeps as its own record() instead of packing it again.
        return TombstoneRecord(Tombstone.from_record(record_of(kept)), expires_at)

    def mailbox(self, tomb: Tombstone, until: float) -> None:
        """Keep ``tomb``'s outcome in its cohort's mailbox until ``until``, and no more
        mailboxes than ``max_terminal_cohorts`` (the oldest go first): a busy process
        ends far more cohorts in ``MAILBOX_TTL_S`` than it keeps tombstones. The bytes
        are the tombstone's own record, so an explicit cohort's costs nothing twice."""
        boxes = self.mailboxes
        boxes.pop(tomb.key, None)
        boxes[tomb.key] = (tomb.record(), until)
        while len(boxes) > self.max_tombstones:
            boxes.popitem(last=False)

    def unexpired_mailbox(self, key: CohortKey, now: float) -> Tombstone | None:
        kept = self.mailboxes.get(key)
        return Tombstone.from_record(kept[0]) if kept is not None and kept[1] > now else None

    # ------------------------------------------------------------------ fan-out
    def publish(
        self, ended: Sequence[CohortKey], grown: Sequence[CohortKey], origin: object = None
    ) -> None:
        """Tell the listeners what a commit ended and grew, on the loop after it. The
        ends are not told to the listener of ``origin`` (the store that committed): its
        runtime had them from its own commit."""
        if not self.listeners or not (ended or grown):
            return
        loop = asyncio.get_running_loop()
        for owner, on_ended, on_grown in list(self.listeners):
            if owner is not origin:
                for key in ended:
                    loop.call_soon(on_ended, key)
            for key in grown:
                loop.call_soon(on_grown, key)
