"""The durable-store interface, and the ``store`` URL that picks a backend.

The runtime writes every decision's records through this interface and reads them
back at start-up (docs/durability.md). ``memory://`` keeps nothing across a restart;
``sqlite:///PATH`` is a file (``sqlite:///genrm-state.sqlite3`` in the working
directory, ``sqlite:////var/lib/genrm/state.sqlite3`` for an absolute path, four
slashes as in SQLAlchemy's URLs); ``redis://HOST:PORT/DB`` is a shared Redis
(``genrm_grpc.store.redis``), which the server's settings do not accept yet: several
replicas on one Redis need the replica protocol first (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit

from genrm_grpc.cohort.journal import VerdictJournal
from genrm_grpc.cohort.records import (
    DropCohort,
    DropTombstone,
    Record,
    Recovered,
    TombstoneRecord,
    VerdictRecord,
)
from genrm_grpc.store.records import StoreError, copy_result
from genrm_grpc.store.sqlite import SqliteStore


class DurableStore(Protocol):
    #: True when what is persisted outlives the process (a drain then keeps active
    #: cohorts for the next process instead of failing them).
    survives_restart: bool

    async def open(self, now_wall: float) -> Recovered:
        """Prepare the store and return what it holds that has not expired."""

    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        """Write ``records``; the future resolves once they are durable (raises StoreError)."""

    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        """A journaled verdict on the same question within the group ``scope``, if any."""

    async def close(self) -> None: ...


class MemoryDurable:
    """Nothing is written anywhere: a restart starts from nothing.

    Journaled verdicts of masked and failed attempts are kept in an in-process index, so
    verdict reuse between attempts of a group works for the usual retry (a judge outage
    masked attempt k, attempt k + 1 sends the same answers) for as long as the process
    lives; a file keeps every attempt's verdicts.
    """

    survives_restart = False

    def __init__(self) -> None:
        self.records = 0
        self._journal = VerdictJournal()
        # Every write is done at once: one resolved future per event loop serves them all.
        self._written: asyncio.Future[None] | None = None

    async def open(self, now_wall: float) -> Recovered:
        return Recovered()

    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        self.records += len(records)
        for record in records:
            if isinstance(record, VerdictRecord):
                self._journal.add(record)
            elif isinstance(record, TombstoneRecord):
                tomb = record.tombstone
                if not tomb.masked and tomb.failed is None:
                    # A completed cohort's verdicts are rarely asked again, and in memory
                    # they would cost ~100 objects per retained cohort: only masked and
                    # failed attempts (those a caller retries) keep theirs.
                    self._journal.drop(tomb.key)
            elif isinstance(record, DropTombstone) or (
                isinstance(record, DropCohort) and not record.keep_verdicts
            ):
                self._journal.drop(record.key)
        written = self._written
        loop = asyncio.get_running_loop()
        if written is None or written.get_loop() is not loop:
            written = self._written = loop.create_future()
            written.set_result(None)
        return written

    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        return self._journal.reusable(scope, context, first, second, judge_index, swap)

    async def close(self) -> None:
        return None


class TurnBatched:
    """``store`` with every write begun in one turn of the event loop sent as one batch.

    The single process's group store commits each decision on its own (a 1-member group
    is one commit per member); this gives the writer thread one batch, one future and
    one wake-up per loop turn instead. The writes of one turn succeed or fail together.
    :meth:`close` sends what is queued first.
    """

    def __init__(self, store: DurableStore) -> None:
        self.store = store
        self.survives_restart = store.survives_restart
        self._records: list[Record] = []
        self._write: asyncio.Future[None] | None = None

    async def open(self, now_wall: float) -> Recovered:
        return await self.store.open(now_wall)

    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        write = self._write
        if write is None:
            loop = asyncio.get_running_loop()
            write = self._write = loop.create_future()
            loop.call_soon(self._send)
        self._records.extend(records)
        return write

    def _send(self) -> None:
        records, self._records = self._records, []
        write, self._write = self._write, None
        if write is None:
            return  # sent already (a close)
        try:
            stored = self.store.persist(records)
        except Exception as exc:  # a store that raises instead of failing its future
            write.set_exception(StoreError(f"the write failed: {exc}"))
            write.exception()
            return
        stored.add_done_callback(lambda done: copy_result(done, write))

    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        return await self.store.find_verdict(scope, context, first, second, judge_index, swap)

    async def close(self) -> None:
        self._send()
        await self.store.close()


def validate_store_url(url: str) -> str:
    """The URL itself when this server can open it; ValueError naming the problem."""
    parts = urlsplit(url)
    if parts.scheme == "memory":
        if parts.netloc or parts.path not in ("", "/"):
            raise ValueError(f"store {url!r}: memory:// takes no path")
        return url
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise ValueError(
                f"store {url!r}: a sqlite URL has no host; use sqlite:///relative/path "
                "or sqlite:////absolute/path"
            )
        if parts.path in ("", "/"):
            raise ValueError(f"store {url!r}: the sqlite URL names no file")
        return url
    if parts.scheme == "redis":
        try:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            raise ValueError(f"store {url!r}: the port is not a number") from None
        if not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"store {url!r}: a redis URL is redis://HOST:PORT/DB")
        if not parts.path.lstrip("/").isdigit() and parts.path not in ("", "/"):
            raise ValueError(f"store {url!r}: the database must be a number (redis://HOST/0)")
        return url
    raise ValueError(
        f"store {url!r}: the scheme must be memory://, sqlite:///PATH or redis://HOST:PORT/DB"
    )


def store_from_url(url: str, *, synchronous: str = "FULL", max_tombstones: int = 0) -> DurableStore:
    """The store ``url`` names. ``max_tombstones`` bounds what a shared (Redis) store
    retains (``max_terminal_cohorts``); a store of one process is bounded by its registry."""
    validate_store_url(url)
    parts = urlsplit(url)
    if parts.scheme == "memory":
        return MemoryDurable()
    if parts.scheme == "redis":
        # Imported here: a server on a file or in memory never needs the Redis client.
        from genrm_grpc.store.redis import RedisStore

        return RedisStore(url, max_tombstones=max_tombstones)
    # sqlite:///rel → "/rel" → "rel"; sqlite:////abs → "//abs" → "/abs".
    return SqliteStore(parts.path[1:], synchronous=synchronous)
