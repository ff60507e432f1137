"""The Redis store: the durable records in a shared Redis, one transaction per commit.

``store: redis://HOST:PORT/DB``. The records and their meaning are the SQLite store's
(watermarks only rise, dropping a tombstone drops the cohort's journaled verdicts,
``open`` returns active cohorts with their members, unexpired tombstones and watermarks
and the verdicts of active cohorts); only the layout differs. This module keeps the
connection and the writer; the key names are made in ``genrm_grpc.store.redis_keys``, the
records encoded and decoded in ``genrm_grpc.store.redis_codec``, and the script that
writes them is ``APPLY`` of ``genrm_grpc.store.lua``.

**Key layout.** Every key of a group carries the group's hash tag ``{T}``, ``T`` being
a short digest of the group scope (of the cohort key for a legacy cohort, which has no
group). A digest rather than the scope itself: scopes are arbitrary text and a ``}``
inside one would end the tag early. So all keys of one group live in one Redis Cluster
hash slot, and a group's writes are one single-slot transaction.

====================================  =====================================================
``genrm:c:{T}:<key>``  hash           an active cohort: field ``h`` its header, ``m:<slot>``
                                      each member (no TTL: removed by ``DropCohort``)
``genrm:v:{T}:<key>``  hash           the verdict journal of one cohort, field ``i:j:k``
                                      per judge pass (expires with the cohort's tombstone)
``genrm:r:{T}``        hash           the group's reuse index: field = the question
                                      (context, answer digests, judge index, swap) → the
                                      cohorts' verdicts on it
``genrm:t:{T}:<key>``  string         a tombstone: expiry + ``Tombstone.record()`` bytes,
                                      TTL at ``expires_at``
``genrm:w:{T}``        string         the group's watermark, TTL at ``expires_at``
``genrm:it``           zset           tombstone key → its expiry (ms): what is retained,
                                      counted and bounded (``max_terminal_cohorts``)
``genrm:iw``           zset           watermark key → its expiry (ms), counted
====================================  =====================================================

**Retention.** Tombstones and watermarks expire with their TTL. The two indexes make
them countable without a scan (``counts``), and bound the tombstones: a commit that
writes one past ``max_terminal_cohorts`` drops, in the same script, those that expire
first, with their journaled verdicts, as the in-process store drops its oldest. The
indexes forget expired entries as they go, so their upkeep is paid by the writes.

``<key>`` is the cohort key as ASCII JSON. Times are wall-clock seconds; TTLs are set
with absolute instants (``PXAT``/``PEXPIREAT``), so a Redis whose clock agrees with the
replicas' expires records at the same instant the SQLite store would stop reading them.

**Writing.** ``persist`` queues a batch; one writer task takes every batch queued when it
wakes (those that arrived while the previous round trip was in flight) and sends them as
one ``MULTI``/``EXEC`` pipeline: one round trip per commit, however many batches. The
transaction loads the store's one Lua script (``APPLY`` of ``genrm_grpc.store.lua``;
``SCRIPT LOAD``, so a Redis that forgot its scripts in a restart cannot fail half a
commit) and runs it once per batch (``EVALSHA``): a batch is applied by one script,
atomically. Each batch is encoded before anything is sent, so a batch that cannot be
encoded fails on its own. Redis applies an ``EXEC`` whole or not at all when the
connection drops (a transaction whose ``EXEC`` never arrived is discarded) and every
write is idempotent, so a commit retried after a lost reply writes the same state.
Redis does not roll back a script that fails halfway (a key of the wrong type, written
by something else): that batch fails, possibly partly applied, and the other batches
of the commit are retried on their own.

**Fencing.** ``persist(records, lease=...)`` fences a batch by a lease
(``genrm_grpc.store.lease``; the replicas' evaluation lease): the script writes it only
while that lease's key still holds the lease's value, else nothing of it, and the future
fails with :class:`LeaseLostError`. A replica that paused or lost Redis past its lease
therefore cannot journal a verdict.

**Failures.** A connection failure or timeout fails the commit's futures with
:class:`RedisUnavailableError` naming the address (``redis://HOST:PORT/DB``, never a
password); redis-py reconnects on the next command, so the store works again as soon
as Redis does, without a restart. ``open`` against an unreachable Redis raises
:class:`RedisStartupError` (a :class:`StoreSchemaError`: the server refuses to start
with that one line).

**Cluster.** The layout is Cluster-ready (one slot per group) but this class speaks to
one Redis: with Cluster a commit would be split into one transaction per slot, and
atomicity would hold per group rather than per commit. Not built yet.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from genrm_grpc.cohort.records import Record, Recovered, VerdictRecord
from genrm_grpc.store.lease import LeaseLostError
from genrm_grpc.store.lua import APPLY, APPLY_SHA
from genrm_grpc.store.records import StoreError, StoreSchemaError, keep_recent
from genrm_grpc.store.redis_codec import decode_all, encode_ops, question, reuse_verdict
from genrm_grpc.store.redis_keys import Keys

if TYPE_CHECKING:
    from genrm_grpc.store.lease import Lease

log = logging.getLogger(__name__)

PREFIX = "genrm"
#: What redis-py raises when Redis does not answer (refused, dropped, timed out).
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)


class RedisUnavailableError(StoreError):
    """Redis did not answer (connection refused or lost, timeout): retry later."""


class RedisStartupError(StoreSchemaError):
    """``open`` could not reach Redis or read it: the server refuses to start."""


@dataclass
class RedisStats:
    """Counters for tests, benchmarks and metrics."""

    round_trips: int = 0
    commits: int = 0
    batches: int = 0
    records: int = 0
    failures: int = 0
    in_flight: int = 0
    last_error: str | None = None
    commit_seconds: list[float] = field(default_factory=list)


@dataclass(eq=False)
class _Batch:
    records: Sequence[Record]
    future: asyncio.Future[None]
    lease: Lease | None = None


_Command = tuple[str | bytes | int, ...]
_STOP = object()


def redacted_address(url: str) -> str:
    """``redis://HOST:PORT/DB`` without user-info: safe for logs and error messages."""
    parts = urlsplit(url)
    db = parts.path.lstrip("/") or "0"
    return f"redis://{parts.hostname}:{parts.port or 6379}/{db}"


class RedisStore:
    """Durable records in one Redis database, written by one task, group commit."""

    survives_restart = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = PREFIX,
        max_tombstones: int = 0,
        socket_timeout_s: float = 5.0,
        connect_timeout_s: float = 2.0,
        retries: int = 2,
    ) -> None:
        self.url = url
        self.address = redacted_address(url)
        self.stats = RedisStats()
        #: Tombstones retained in the whole store, at most (``max_terminal_cohorts``; 0:
        #: only their TTL bounds them). Checked in the script that writes each one.
        self.max_tombstones = max_tombstones
        self._keys = Keys(prefix)
        self._prefix = prefix
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    async def open(self, now_wall: float) -> Recovered:
        """Reach Redis and read back what has not expired; RedisStartupError if unreachable."""
        try:
            raw = await self._load_raw()
        except UNAVAILABLE as exc:
            raise RedisStartupError(f"cannot reach the store {self.address}: {exc}") from exc
        except RedisError as exc:
            raise RedisStartupError(f"the store {self.address} could not be read: {exc}") from exc
        try:
            recovered = await asyncio.to_thread(decode_all, raw, now_wall)
        except (ValueError, TypeError, KeyError, IndexError, EOFError, struct.error) as exc:
            raise RedisStartupError(f"the store {self.address} is unreadable: {exc}") from exc
        self._writer = asyncio.get_running_loop().create_task(
            self._run(), name="genrm-redis-writer"
        )
        return recovered

    async def start(self) -> None:
        """Reach Redis and start the writer without reading the store back (replicas read
        each group when they need it); RedisStartupError when Redis is unreachable."""
        try:
            await self._client.ping()
        except (*UNAVAILABLE, RedisError) as exc:
            raise RedisStartupError(f"cannot reach the store {self.address}: {exc}") from exc
        if self._writer is None and not self._closed:
            self._writer = asyncio.get_running_loop().create_task(
                self._run(), name="genrm-redis-writer"
            )

    async def close(self) -> None:
        """Commit what is queued, then close the connections."""
        writer, self._writer = self._writer, None
        self._closed = True
        if writer is not None:
            self._queue.put_nowait(_STOP)
            await writer
        await self._client.aclose()

    # ------------------------------------------------------------------ reading
    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        """A journaled verdict on the same question within the group ``scope``, if any."""
        if self._closed:
            raise StoreError(f"the store {self.address} is closed")
        asked = question(context, first, second, judge_index, swap)
        self.stats.round_trips += 1
        try:
            raw = await self._client.hget(self._keys.reuse_of_scope(scope), asked)
        except UNAVAILABLE as exc:
            raise RedisUnavailableError(f"the store {self.address} is unreachable: {exc}") from exc
        except RedisError as exc:
            raise StoreError(f"the store {self.address} could not be read: {exc}") from exc
        if raw is None:
            return None
        return reuse_verdict(raw, scope, context, first, second, judge_index, swap)

    # ------------------------------------------------------------------ writing
    @property
    def write_failures(self) -> int:
        """Batches Redis did not take (unreachable, refused); a batch refused because
        its lease was lost is not one."""
        return self.stats.failures

    def persist(
        self, records: Sequence[Record], *, lease: Lease | None = None
    ) -> asyncio.Future[None]:
        """Queue ``records`` for the next commit; the future resolves once Redis has them.

        It fails with :class:`RedisUnavailableError` when Redis cannot be reached and
        with :class:`StoreError` when the batch cannot be written; a failed batch
        writes nothing. With ``lease`` (an evaluation lease of
        ``genrm_grpc.store.shared``) the batch is *fenced*: every record must belong to
        the lease's group, and the batch is written only if the lease is still current
        when Redis applies it — else the future fails with :class:`LeaseLostError` and
        nothing is written.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not records:
            future.set_result(None)
        elif self._writer is None:
            future.set_exception(StoreError(f"the store {self.address} is closed"))
        else:
            self._queue.put_nowait(_Batch(records, future, lease))
        return future

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            batches = [item for item in items if isinstance(item, _Batch)]
            stopping = any(item is _STOP for item in items)
            if not batches:
                continue
            try:
                await self._commit(batches)
            except Exception as exc:  # the writer must outlive any one commit
                log.exception("store commit crashed")
                self._fail(batches, StoreError(f"the store {self.address} failed: {exc}"))

    async def _commit(self, batches: list[_Batch]) -> None:
        started = time.perf_counter()
        encoded: list[tuple[_Batch, _Command]] = []
        for batch in batches:
            try:
                encoded.append((batch, self._encode(batch.records, batch.lease)))
            except Exception as exc:  # one bad batch must not fail its neighbours
                self._fail([batch], StoreError(f"the store {self.address} cannot write: {exc}"))
        if not encoded:
            return
        outcome = await self._transaction([command for _, command in encoded])
        failed_inside = isinstance(outcome, StoreError) and not isinstance(
            outcome, RedisUnavailableError
        )
        if failed_inside and len(encoded) > 1:
            # A batch failed inside EXEC; every write is idempotent, so each batch is
            # retried on its own and only the bad one fails.
            for batch, command in encoded:
                self._finish([batch], await self._transaction([command]), started)
            return
        self._finish([batch for batch, _ in encoded], outcome, started)

    async def _transaction(self, commands: list[_Command]) -> StoreError | list[object]:
        """One MULTI/EXEC: load the script, then one EVALSHA per batch; their results."""
        self.stats.round_trips += 1
        self.stats.in_flight += 1
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.execute_command("SCRIPT", "LOAD", APPLY)
                for command in commands:
                    pipe.execute_command(*command)
                results: list[object] = await pipe.execute()
        except UNAVAILABLE as exc:
            return RedisUnavailableError(f"the store {self.address} is unreachable: {exc}")
        except RedisError as exc:
            return StoreError(f"the store {self.address} could not commit: {exc}")
        finally:
            self.stats.in_flight -= 1
        return results[1:]

    def _finish(
        self, batches: list[_Batch], outcome: StoreError | list[object], started: float
    ) -> None:
        if isinstance(outcome, StoreError):
            log.error("store commit failed: %s", outcome)
            self._fail(batches, outcome)
            return
        self.stats.commits += 1
        keep_recent(self.stats.commit_seconds, time.perf_counter() - started)
        for batch, applied in zip(batches, outcome, strict=True):
            if applied != 1:
                assert batch.lease is not None  # only a fenced batch is refused
                self._fail(
                    [batch],
                    LeaseLostError(
                        f"the lease {batch.lease.token} of a group is no longer current in "
                        f"the store {self.address}: nothing written"
                    ),
                    counted=False,  # the fence did its job: the store did not fail
                )
                continue
            self.stats.batches += 1
            self.stats.records += len(batch.records)
            if not batch.future.done():
                batch.future.set_result(None)

    def _fail(self, batches: list[_Batch], error: StoreError, *, counted: bool = True) -> None:
        if counted:
            self.stats.failures += 1
            self.stats.last_error = str(error)
        for batch in batches:
            if not batch.future.done():
                batch.future.set_exception(error)

    def _encode(self, records: Sequence[Record], lease: Lease | None) -> _Command:
        """The batch as one EVALSHA of ``lua.APPLY`` (its operations: ``lua.OPS``)."""
        names, args = self.encode_ops(records)
        return self._fenced(names, args, lease)

    def encode_ops(self, records: Sequence[Record]) -> tuple[list[str], list[str | bytes | int]]:
        """The keys and arguments of ``apply_ops`` that write ``records`` (see
        ``redis_codec.encode_ops``)."""
        return encode_ops(records, self._keys, self.max_tombstones)

    def _fenced(
        self, names: list[str], args: list[str | bytes | int], lease: Lease | None
    ) -> _Command:
        if lease is None:
            return ("EVALSHA", APPLY_SHA, len(names) + 1, names[0], *names, "", *args)
        lease_key = lease.key
        tag = lease_key[lease_key.index("{") : lease_key.index("}") + 1]
        # The retention indexes are the deployment's, like the replicas' own indexes.
        indexes = (self._keys.tombstone_index, self._keys.watermark_index)
        foreign = next((n for n in names if tag not in n and n not in indexes), None)
        if foreign is not None:
            raise ValueError(f"a batch fenced by the lease of one group writes {foreign}")
        return ("EVALSHA", APPLY_SHA, len(names) + 1, lease_key, *names, lease.value, *args)

    # ------------------------------------------------------------------ start-up read
    async def _load_raw(self) -> dict[str, list[tuple[bytes, Any]]]:
        """Every key of the store with its value, by kind: c, t, w and v (active only)."""
        names: dict[str, list[bytes]] = {"c": [], "t": [], "w": []}
        cursor: int = 0
        pattern = f"{self._prefix}:*"
        start = len(self._prefix) + 1
        while True:
            self.stats.round_trips += 1
            cursor, found = await self._client.scan(cursor, match=pattern, count=1000)
            for name in found:
                raw_name = name if isinstance(name, bytes) else name.encode()
                kind = raw_name[start : start + 1].decode()
                if kind in names:
                    names[kind].append(raw_name)
            if cursor == 0:
                break
        verdict_names = [
            name[:start] + b"v" + name[start + 1 :] for name in names["c"]
        ]  # the journals of active cohorts
        raw: dict[str, list[tuple[bytes, Any]]] = {}
        for kind, keys, command in (
            ("c", names["c"], "HGETALL"),
            ("v", verdict_names, "HGETALL"),
            ("t", names["t"], "GET"),
            ("w", names["w"], "GET"),
        ):
            values: list[Any] = []
            for chunk in range(0, len(keys), 1000):
                self.stats.round_trips += 1
                async with self._client.pipeline(transaction=False) as pipe:
                    for name in keys[chunk : chunk + 1000]:
                        pipe.execute_command(command, name)
                    values.extend(await pipe.execute())
            raw[kind] = list(zip(keys, values, strict=True))
        return raw
