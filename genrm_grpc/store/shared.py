"""Replicas sharing one Redis: what a decision reads, and the fenced commit that writes it.

With ``store: redis://HOST:PORT/DB`` every replica of a deployment decides about a group
on the group's state as Redis holds it (docs/scaling.md). This module is the Redis side
of that protocol; the rules stay in the registry and the runtime
(``genrm_grpc.runtime.replica``) drives them:

1. **Read** (:meth:`SharedGroups.load`, one script, one round trip): the group's
   *version* — its fencing token, raised by every commit —, its watermark, the
   cohort under the member's key and the group's newest attempt (active, with the
   members' digests but not their texts, or their tombstones), and the deployment's
   active-cohort counts (total and the principal's).
2. **Decide**: the registry applies the event to that state, in a registry holding only
   this group.
3. **Commit** (:meth:`SharedGroups.commit`, one script, one round trip): the decision's
   records are written only if the group's version is still the one read, and, for an
   evaluation's result, only while the evaluator's lease is the group's current one.
   Else nothing is written and the replica reads and decides again. The same script
   keeps the deadline and evaluation indexes and the counts, leaves each ended cohort's
   outcome in a *mailbox* key and publishes the cohort's key on the replicas' channel,
   after the writes: a message always names an outcome that is already stored.

A replica that paused or lost Redis therefore cannot write on a stale view: any commit
since its read raised the version (and a taken-over evaluation changed the lease), so
its commit is refused, and nothing it decided is published.

The scripts are in ``genrm_grpc.store.lua``, with the store's batch script; the key
names in ``genrm_grpc.store.redis_keys``; the channel's subscriber and its messages
in ``genrm_grpc.store.channel``.

Keys, beyond those of ``genrm_grpc.store.redis`` (same hash tag ``{T}`` per group):

=========================  ========  ================================================
``genrm:g:{T}``            string    the group's version (fencing token of commits)
``genrm:e:{T}``            string    the evaluation lease ``<token>:<owner>`` (``PX``);
                                     with eager judging taken when the cohort is created
``genrm:x:{T}``            string    the evaluation leases' fencing counter
``genrm:o:{T}:<key>``      string    an ended cohort's outcome (its packed tombstone),
                                     for waiters on other replicas; short TTL
``genrm:dl``               zset      active cohort → its next deadline (ms)
``genrm:ev``               zset      evaluating cohort → its lease's expiry (ms)
``genrm:n``                hash      active cohorts: ``*`` in all, ``p:<principal>``
channel ``genrm:ended``              the key of every cohort that ended; with eager
                                     judging also ``+<key>`` of a cohort that grew
=========================  ========  ================================================

``genrm:dl``, ``genrm:ev`` and ``genrm:n`` are deployment-wide keys, outside the group's
hash slot: on a single Redis (primary + replicas) a commit is one script; a Redis
Cluster would need them per shard, which is not built.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import RedisError

from genrm_grpc.cohort.model import CohortKey, Tombstone
from genrm_grpc.cohort.records import (
    Record,
    RecoveredCohort,
    VerdictRecord,
)
from genrm_grpc.store import channel
from genrm_grpc.store.group_state import MAILBOX_TTL_S, Committed, GroupState, SharedStats
from genrm_grpc.store.lease import Lease
from genrm_grpc.store.lua import CENSUS, CLAIM, COMMIT, LOAD, RELEASE, RENEW
from genrm_grpc.store.records import StoreError, keep_recent
from genrm_grpc.store.redis import (
    UNAVAILABLE,
    RedisStartupError,
    RedisStore,
    RedisUnavailableError,
)
from genrm_grpc.store.redis_codec import (
    decode_cohort,
    decode_tombstone,
    digest_group,
    index_ops,
    ms,
    verdict_from,
)
from genrm_grpc.store.redis_keys import key_from, key_text

log = logging.getLogger(__name__)

#: How long a group's version counter outlives its last commit.
VERSION_TTL_S = 86_400.0


class SharedGroups:
    """One replica's access to the shared group state (on a :class:`RedisStore`'s client)."""

    def __init__(
        self,
        store: RedisStore,
        *,
        lease_s: float,
        replica: str | None = None,
    ) -> None:
        self.store = store
        self.address = store.address
        # Host and pid first, so that an operator (or a test) reading a lease sees which
        # process holds it; the nonce tells apart a restarted process with the same pid.
        self.replica = replica or f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.lease_s = lease_s
        self.stats = SharedStats()
        self.shared_by_replicas = True
        #: Called with the seconds of every round trip (the store-latency metric).
        self.on_round_trip: Callable[[float], None] | None = None
        self._client = store._client
        self._keys = store._keys
        self.channel = self._keys.channel
        self._load = self._client.register_script(LOAD)
        self._commit = self._client.register_script(COMMIT)
        self._claim = self._client.register_script(CLAIM)
        self._renew = self._client.register_script(RENEW)
        self._release = self._client.register_script(RELEASE)
        self._census = self._client.register_script(CENSUS)

    # ------------------------------------------------------------------ keys
    def version_key(self, key: CohortKey) -> str:
        return self._keys.version(key)

    def lease_key(self, key: CohortKey) -> str:
        return self._keys.lease(key)

    def mailbox_key(self, key: CohortKey) -> str:
        return self._keys.mailbox(key)

    # ------------------------------------------------------------------ calls
    async def _call(self, what: str, call: Awaitable[Any], *, write: bool = False) -> Any:
        """``call``'s answer; StoreError when Redis does not answer or refuses it (a
        ``write`` that fails is counted: the calls depending on it get STORE_UNAVAILABLE)."""
        started = time.perf_counter()
        try:
            return await call
        except UNAVAILABLE as exc:
            self.stats.failures += write
            raise RedisUnavailableError(f"the store {self.address} is unreachable: {exc}") from exc
        except RedisError as exc:
            self.stats.failures += write
            raise StoreError(f"the store {self.address} refused {what}: {exc}") from exc
        finally:
            elapsed = time.perf_counter() - started
            keep_recent(self.stats.latencies, elapsed)
            if self.on_round_trip is not None:
                self.on_round_trip(elapsed)

    async def connect(self) -> int:
        """Reach Redis (start-up): RedisStartupError naming the address when it cannot.
        Nothing is read back (0): the sweeps pick up what the deployment holds."""
        try:
            await self._client.ping()
        except (*UNAVAILABLE, RedisError) as exc:
            raise RedisStartupError(f"cannot reach the store {self.address}: {exc}") from exc
        return 0

    async def ping(self) -> None:
        await self._call("PING", self._client.ping())

    async def census(self, now: float) -> tuple[int, int, int, int]:
        """The deployment's active, evaluating, tombstone and watermark counts (one round
        trip; the state gauges of every replica)."""
        keys = self._keys
        names = [keys.counts, keys.evaluations, keys.tombstone_index, keys.watermark_index]
        raw = await self._call("a census", self._census(keys=names, args=[ms(now)]))
        active, evaluating, tombstones, watermarks = (int(v) for v in raw)
        self.stats.active_seen = active
        return active, evaluating, tombstones, watermarks

    # ------------------------------------------------------------------ read
    async def load(self, key: CohortKey) -> GroupState:
        """The group of ``key`` as Redis holds it now (one round trip)."""
        keys = self._keys
        scope = key.group_scope
        if scope is not None:
            mark = keys.watermark(scope)
            cohort_head, tomb_head, tail = keys.attempt_heads(key)
        else:
            mark = keys.tagged("w", key)  # never written: no watermark
            cohort_head, tomb_head, tail = "", "", ""
        self.stats.loads += 1
        raw = await self._call(
            "a group read",
            self._load(
                keys=[
                    self.version_key(key),
                    mark,
                    self._keys.counts,
                    keys.cohort(key),
                    keys.tombstone(key),
                ],
                args=[cohort_head, tomb_head, tail, str(key.attempt), f"p:{key.principal}"],
            ),
        )
        version, _mark, total, principal, *_ = raw
        self.stats.active_seen = int(total)
        return GroupState(
            key=key,
            version=_text(version),
            recovered=digest_group(key, raw, time.time()),
            active_total=int(total),
            active_principal=int(principal),
        )

    async def version(self, key: CohortKey) -> str:
        """The group's version now (one round trip, no state)."""
        raw = await self._call("a version read", self._client.get(self.version_key(key)))
        return "0" if raw is None else _text(raw)

    async def load_evaluation(
        self, key: CohortKey
    ) -> tuple[RecoveredCohort | None, list[VerdictRecord]]:
        """An evaluating cohort with its members' texts, and its journaled verdicts."""
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.cohort(key))
            pipe.hgetall(self._keys.verdicts(key))
            fields, journal = await self._call("an evaluation read", pipe.execute())
        if not fields or b"h" not in fields:
            return None, []
        verdicts = [verdict_from(value) for value in (journal or {}).values()]
        return decode_cohort(key, fields), verdicts

    async def outcomes(self, keys: Iterable[CohortKey]) -> dict[CohortKey, Tombstone]:
        """The ended cohorts among ``keys``, with their outcomes (mailbox, else tombstone)."""
        wanted = list(keys)
        if not wanted:
            return {}
        async with self._client.pipeline(transaction=False) as pipe:
            for key in wanted:
                pipe.get(self.mailbox_key(key))
                pipe.get(self._keys.tombstone(key))
            values = await self._call("an outcome read", pipe.execute())
        found: dict[CohortKey, Tombstone] = {}
        for index, key in enumerate(wanted):
            mailbox, tomb = values[2 * index], values[2 * index + 1]
            if mailbox:
                found[key] = Tombstone.from_record(mailbox)
            elif tomb:
                found[key] = decode_tombstone(tomb).tombstone
        return found

    async def due(self, now: float, limit: int = 64) -> list[CohortKey]:
        """Active cohorts whose next deadline has passed (oldest first)."""
        raw = await self._call(
            "a deadline scan",
            self._client.zrangebyscore(self._keys.deadlines, "-inf", ms(now), start=0, num=limit),
        )
        return [key_from(member) for member in raw]

    async def orphaned(self, now: float, limit: int = 16) -> list[CohortKey]:
        """Evaluating cohorts whose evaluator's lease has expired (or was handed off)."""
        raw = await self._call(
            "an evaluation scan",
            self._client.zrangebyscore(self._keys.evaluations, "-inf", ms(now), start=0, num=limit),
        )
        return [key_from(member) for member in raw]

    async def forget(self, key: CohortKey) -> None:
        """Drop a key the indexes still name but no active cohort has (a stale entry)."""
        member = key_text(key)
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.zrem(self._keys.deadlines, member)
            pipe.zrem(self._keys.evaluations, member)
            await self._call("an index cleanup", pipe.execute())

    def watch_due(self, on_due: Callable[[CohortKey], None]) -> Callable[[], None] | None:
        """None: the deadlines are Redis's index, which every replica's sweep polls
        (:meth:`due`); no replica holds a timer for a deadline another one filed."""
        return None

    def lease_now(self) -> float:
        """Now, in the time a lease's ``valid_until`` counts in (``time.monotonic()``:
        this replica's own, which no clock step moves)."""
        return time.monotonic()

    async def active_keys(self) -> list[CohortKey]:
        """Every active cohort of the deployment (each has a deadline): a full read."""
        raw = await self._call("a deadline read", self._client.zrange(self._keys.deadlines, 0, -1))
        return [key_from(member) for member in raw]

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
        """Write ``records`` if the group is still as ``state`` read it (one round trip).

        ``ended``: the outcomes of cohorts the decision ended (mailbox + message).
        ``evaluate``: a cohort the decision froze; this replica takes its evaluation
        lease in the same script, unless a replica holds it already (eager judging),
        and the cohort enters the evaluation index either way. ``collect``: a cohort the
        decision created under eager judging; this replica takes its lease (not filed
        in the evaluation index: a collecting cohort is not evaluating). ``grown``:
        cohorts that gained members or froze, announced on the channel for the replica
        judging them eagerly. ``fence``: the evaluation lease the decision was made
        under (an evaluation's result), which must still be current.
        """
        key = state.key
        names, args = self.store.encode_ops(records)
        now = time.time()
        index_ops(records, state.active_keys, self._keys, names, args)
        self._message_ops(ended, grown, now, names, args)
        self._lease_ops(evaluate, collect, now, names, args)
        version_key = self.version_key(key)
        lease_key = fence.key if fence is not None else version_key
        self.stats.commits += 1
        result = await self._call(
            "a group commit",
            self._commit(
                keys=[version_key, lease_key, *names],
                args=[
                    state.version,
                    fence.value if fence is not None else "",
                    _ms_span(VERSION_TTL_S),
                    *args,
                ],
            ),
            write=True,
        )
        status, token = int(result[0]), int(result[1])
        if status == 0:
            self.stats.conflicts += 1
            return Committed(False)
        if status == -1:
            self.stats.leases_lost += 1
            return Committed(False, lease_lost=True)
        # The script raises the group's version by one (INCR).
        return Committed(True, token=token, version=str(int(state.version) + 1))

    def _message_ops(
        self,
        ended: Sequence[Tombstone],
        grown: Sequence[CohortKey],
        now: float,
        names: list[str],
        args: list[Any],
    ) -> None:
        """Each ended cohort's mailbox and message, then each grown cohort's message."""
        for tomb in ended:
            names.append(self.mailbox_key(tomb.key))
            args += ["S", tomb.record(), ms(now + MAILBOX_TTL_S)]
            args += ["P", self.channel, channel.ended_message(tomb.key)]
        for grew in grown:
            args += ["P", self.channel, channel.grown_message(grew)]

    def _lease_ops(
        self,
        evaluate: CohortKey | None,
        collect: CohortKey | None,
        now: float,
        names: list[str],
        args: list[Any],
    ) -> None:
        """This replica's evaluation lease on ``evaluate`` (filed in the evaluation
        index) or ``collect`` (eager judging), unless another replica holds it."""
        lease_of = evaluate if evaluate is not None else collect
        if lease_of is not None:
            names += [self.lease_key(lease_of), self._keys.fence(lease_of)]
            args += ["L", self.replica, _ms_span(self.lease_s), _ms_span(VERSION_TTL_S)]
        if evaluate is not None:
            names.append(self._keys.evaluations)
            args += ["Z", ms(now + self.lease_s), key_text(evaluate)]

    # ------------------------------------------------------------------ evaluation leases
    def lease_for(self, key: CohortKey, token: int, taken_at: float | None = None) -> Lease:
        """This replica's lease ``token`` on ``key``'s evaluation, valid for ``lease_s``
        from ``taken_at`` (``time.monotonic()``; now when None)."""
        started = time.monotonic() if taken_at is None else taken_at
        scope = key.group_scope or key_text(key)
        return Lease(scope, self.replica, token, started + self.lease_s, key=self.lease_key(key))

    async def claim(self, key: CohortKey) -> Lease | None:
        """Take over an evaluation whose lease is gone; None when someone holds it."""
        started = time.monotonic()
        token = await self._call(
            "a lease claim",
            self._claim(
                keys=[self.lease_key(key), self._keys.fence(key), self._keys.evaluations],
                args=[
                    self.replica,
                    _ms_span(self.lease_s),
                    key_text(key),
                    ms(time.time() + self.lease_s),
                    _ms_span(VERSION_TTL_S),
                ],
            ),
        )
        if token is None:
            return None
        self.stats.takeovers += 1
        return self.lease_for(key, int(token), started)

    async def renew(self, key: CohortKey, lease: Lease) -> Lease | None:
        """The lease extended by ``lease_s``; None when it is no longer this replica's."""
        started = time.monotonic()
        renewed = await self._call(
            "a lease renewal",
            self._renew(
                keys=[lease.key, self._keys.evaluations],
                args=[
                    lease.value,
                    _ms_span(self.lease_s),
                    key_text(key),
                    ms(time.time() + self.lease_s),
                ],
            ),
        )
        if int(renewed) != 1:
            self.stats.leases_lost += 1
            return None
        self.stats.renewals += 1
        return Lease(lease.scope, lease.owner, lease.token, started + self.lease_s, key=lease.key)

    async def release(self, key: CohortKey, lease: Lease) -> None:
        """Give an unfinished evaluation to the next replica that looks (a drain)."""
        await self._call(
            "a lease release",
            self._release(
                keys=[lease.key, self._keys.evaluations], args=[lease.value, key_text(key)]
            ),
        )

    # ------------------------------------------------------------------ messages
    async def listen(
        self,
        on_ended: Callable[[CohortKey], None],
        on_subscribed: Callable[[], Awaitable[None]],
        *,
        stopping: asyncio.Event,
        on_grown: Callable[[CohortKey], None] | None = None,
    ) -> None:
        """Deliver the channel's messages until ``stopping``; resubscribe after a drop.

        A cohort that ended goes to ``on_ended``, one that grew (``channel.GROWN``)
        to ``on_grown``.

        ``on_subscribed`` runs after every (re)subscription: messages published while
        this replica was not subscribed are lost, so it re-reads what it waits for.
        """
        await channel.listen(
            self.store.url,
            self.address,
            self.channel,
            on_ended,
            on_subscribed,
            stopping=stopping,
            on_grown=on_grown,
        )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms_span(seconds: float) -> int:
    return max(1, int(seconds * 1000))
