"""The single process's write queue: every record decided in one loop turn goes to the
durable store as one batch, and each decision gets the future of that batch's write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from genrm_grpc.cohort.records import Record
from genrm_grpc.store.durable import DurableStore
from genrm_grpc.store.records import StoreError, copy_result

log = logging.getLogger(__name__)


class WriteQueue:
    def __init__(self, store: DurableStore, on_failed: Callable[[list[Record]], None]) -> None:
        """``on_failed`` is told the records of every write that failed."""
        self._store = store
        self._on_failed = on_failed
        self._pending: list[Record] = []
        self._pending_write: asyncio.Future[None] | None = None
        self._last_write: asyncio.Future[None] | None = None
        self.failures = 0

    def persist(self, records: list[Record]) -> asyncio.Future[None] | None:
        """Queue ``records``; all queued in one loop iteration go to the store together.

        Returns the future of their write (None when nothing was queued).
        """
        if not records:
            return None
        if not self._store.survives_restart:
            # Nothing to wait for: the records only feed the in-process verdict index.
            written = self._store.persist(records)
            return None if written.done() and written.exception() is None else written
        self._pending.extend(records)
        write = self._pending_write
        if write is None:
            loop = asyncio.get_running_loop()
            write = self._pending_write = loop.create_future()
            loop.call_soon(self._flush)
        return write

    def latest(self) -> asyncio.Future[None] | None:
        """The write still queued, or else the last one started (None before any)."""
        return self._pending_write or self._last_write

    async def flush(self) -> None:
        """Wait until every record queued so far is written (or failed)."""
        if self._pending_write is not None:
            self._flush()
        if self._last_write is not None:
            await asyncio.gather(self._last_write, return_exceptions=True)

    def _flush(self) -> None:
        records, self._pending = self._pending, []
        write, self._pending_write = self._pending_write, None
        if write is None:
            return
        self._last_write = write
        try:
            stored = self._store.persist(records)
        except Exception as exc:  # a store that raises instead of failing its future
            stored = asyncio.get_running_loop().create_future()
            stored.set_exception(StoreError(str(exc)))
        stored.add_done_callback(lambda done: copy_result(done, write))
        write.add_done_callback(lambda done: self._written(records, done))

    def _written(self, records: list[Record], write: asyncio.Future[None]) -> None:
        if not write.cancelled() and write.exception() is None:
            return
        self.failures += 1
        log.error("store write failed: %s", "cancelled" if write.cancelled() else write.exception())
        self._on_failed(records)
