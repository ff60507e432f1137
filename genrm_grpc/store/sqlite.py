"""The SQLite store: one file, WAL, one writer thread, group commit.

Every ``persist`` call hands a batch of records to the writer thread and returns an
awaitable that resolves once the batch is committed. The thread takes every batch that
is waiting when it wakes and commits them in one transaction, so a burst of N
submissions costs one fsync, not N; the transaction writes the end state of all their
records (``sqlite_rows.EndState``: a row written twice is written once, a row deleted
later in the same commit is not written). The event loop never touches the database:
it enqueues and awaits.

The schema carries its version in ``PRAGMA user_version``; opening a file written by a
newer server, or a file that is not a SQLite database, raises
:class:`StoreSchemaError` (the server refuses to start with one line). Older versions
are migrated in place, in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from genrm_grpc.cohort.records import Record, Recovered, VerdictRecord
from genrm_grpc.store.records import StoreError, StoreSchemaError, decode_key, keep_recent
from genrm_grpc.store.sqlite_rows import VERDICT_COLUMNS, EndState, load, stored_cohorts, verdict

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3

# Each entry migrates from version N to N + 1 (index N); version 0 is an empty file.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE cohorts (
            key TEXT PRIMARY KEY,
            scope TEXT,
            seq INTEGER NOT NULL,
            group_size INTEGER NOT NULL,
            prompt TEXT NOT NULL,
            prompt_digest TEXT NOT NULL,
            phase TEXT NOT NULL,
            created_at REAL NOT NULL,
            collection_deadline REAL NOT NULL,
            evaluation_deadline REAL
        )""",
        """CREATE TABLE members (
            key TEXT NOT NULL,
            slot INTEGER NOT NULL,
            coords TEXT NOT NULL,
            digest TEXT NOT NULL,
            reasoning TEXT NOT NULL,
            answer TEXT NOT NULL,
            PRIMARY KEY (key, slot)
        ) WITHOUT ROWID""",
        # ``record`` is Tombstone.record(): the same packed bytes the memory store keeps.
        """CREATE TABLE tombstones (
            key TEXT PRIMARY KEY,
            record BLOB NOT NULL,
            expires_at REAL NOT NULL
        )""",
        "CREATE INDEX tombstones_by_expiry ON tombstones (expires_at)",
        """CREATE TABLE watermarks (
            scope TEXT PRIMARY KEY,
            attempt INTEGER NOT NULL,
            expires_at REAL NOT NULL
        )""",
        "CREATE INDEX watermarks_by_expiry ON watermarks (expires_at)",
        """CREATE TABLE verdicts (
            cohort TEXT NOT NULL,
            response_i INTEGER NOT NULL,
            response_j INTEGER NOT NULL,
            judge_index INTEGER NOT NULL,
            scope TEXT,
            context BLOB NOT NULL,
            first BLOB NOT NULL,
            second BLOB NOT NULL,
            swap INTEGER NOT NULL,
            score_1 REAL NOT NULL,
            score_2 REAL NOT NULL,
            ranking REAL NOT NULL,
            parse_failed INTEGER NOT NULL,
            input_tokens INTEGER,
            output_tokens INTEGER,
            reasoning_tokens INTEGER,
            finished_at REAL NOT NULL,
            PRIMARY KEY (cohort, response_i, response_j, judge_index)
        ) WITHOUT ROWID""",
        # Reuse looks a question up within its group; legacy verdicts have no scope.
        """CREATE INDEX verdicts_by_question ON verdicts
            (scope, context, first, second, judge_index, swap) WHERE scope IS NOT NULL""",
    ),
    # 2: a cohort remembers whether an earlier attempt of its group was seen.
    ("ALTER TABLE cohorts ADD COLUMN follows_attempt INTEGER NOT NULL DEFAULT 0",),
    # 3: tombstones are written as narrower records (Tombstone.record() version 3). Older
    # records still read, so nothing moves; the number keeps an older server out.
    (),
)
assert len(_MIGRATIONS) == SCHEMA_VERSION

_STOP = object()


@dataclass(eq=False)
class _Batch:
    records: Sequence[Record]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


@dataclass
class SqliteStats:
    """Counters for tests, benchmarks and metrics (read from any thread)."""

    commits: int = 0
    batches: int = 0
    records: int = 0
    failures: int = 0
    last_error: str | None = None
    commit_seconds: list[float] = field(default_factory=list)


class SqliteStore:
    """Durable records in one SQLite file, written by one thread."""

    survives_restart = True
    #: How long the writer waits for more batches when it wakes up to a single one.
    gather_s = 0.001

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self._synchronous = synchronous
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        self._lock_fd: int | None = None
        #: Cohort keys that may have rows in the file (the writer thread's; see EndState).
        self._stored: set[str] = set()
        self.stats = SqliteStats()

    # ------------------------------------------------------------------ lifecycle
    async def open(self, now_wall: float) -> Recovered:
        """Open (create, migrate) the file and read back what has not expired."""
        recovered = await asyncio.to_thread(self._open, now_wall)
        self._thread = threading.Thread(target=self._run, name="genrm-sqlite-writer", daemon=True)
        self._thread.start()
        return recovered

    async def close(self) -> None:
        """Commit what is queued, then close the file."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_STOP)
        await asyncio.to_thread(thread.join)
        reader, self._reader = self._reader, None
        if reader is not None:
            with self._reader_lock:
                reader.close()
        self._unlock_file()

    def _lock_file(self) -> None:
        """Hold ``PATH.lock`` exclusively: two servers on one file would each resume the
        other's cohorts and judge them twice. The kernel drops the lock when the process
        dies (SIGKILL included), so a restarted server never finds a stale one."""
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreSchemaError(
                f"the store {self.path} is in use by another server (pid {holder}); "
                "one file serves one server process"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _unlock_file(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    # ------------------------------------------------------------------ reading
    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        """A journaled verdict on the same question within the group ``scope``, if any."""
        return await asyncio.to_thread(
            self._find_verdict, scope, context, first, second, judge_index, swap
        )

    def _find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        with self._reader_lock:
            if self._reader is None:
                raise StoreError(f"the store {self.path} is closed")
            try:
                row = self._reader.execute(
                    f"SELECT cohort, {VERDICT_COLUMNS} FROM verdicts WHERE scope = ? AND "
                    "context = ? AND first = ? AND second = ? AND judge_index = ? AND swap = ? "
                    "LIMIT 1",
                    (
                        scope,
                        bytes.fromhex(context),
                        bytes.fromhex(first),
                        bytes.fromhex(second),
                        judge_index,
                        swap,
                    ),
                ).fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"the store {self.path} could not be read: {exc}") from exc
        return None if row is None else verdict(decode_key(row[0]), row[1:])

    # ------------------------------------------------------------------ writing
    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        """Queue ``records`` for the next group commit; the future resolves when durable.

        The future fails with :class:`StoreError` when the commit fails (disk full,
        I/O error); the records of a failed commit are not written.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if not records:
            future.set_result(None)
            return future
        if self._thread is None:
            future.set_exception(StoreError(f"the store {self.path} is closed"))
            return future

        self._queue.put(_Batch(records, loop, future))
        return future

    # ------------------------------------------------------------------ thread side
    def _open(self, now_wall: float) -> Recovered:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_file()
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            self._unlock_file()
            raise StoreSchemaError(f"cannot open the store {self.path}: {exc}") from exc
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreSchemaError(
                    f"the store {self.path} has schema version {version}, newer than this "
                    f"server's {SCHEMA_VERSION}: run the newer server, or point `store` "
                    "at another file"
                )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreSchemaError(f"the store {self.path} cannot use WAL mode ({mode})")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            if version < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                for step in _MIGRATIONS[version:]:
                    for statement in step:
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            recovered = load(conn, now_wall)
            self._stored = stored_cohorts(conn)
            self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA query_only=ON")
        except StoreSchemaError:
            conn.close()
            self._unlock_file()
            raise
        except (sqlite3.Error, ValueError, TypeError, EOFError) as exc:
            # EOFError, ValueError, TypeError: a record that does not decode.
            conn.close()
            self._unlock_file()
            raise StoreSchemaError(f"the store {self.path} is unreadable: {exc}") from exc
        self._conn = conn
        return recovered

    def _run(self) -> None:
        conn = self._conn
        assert conn is not None
        stopping = False
        while not stopping:
            first = self._queue.get()
            if self._queue.empty() and self.gather_s > 0:
                # Alone: give the loop a moment to queue more, so that a burst shares
                # one commit (a commit's fixed cost is most of the store's CPU).
                time.sleep(self.gather_s)
            pending: list[_Batch] = []
            for item in _drain(first, self._queue):
                if item is _STOP:
                    stopping = True
                elif isinstance(item, _Batch):
                    pending.append(item)
            if pending:
                self._commit(conn, pending)
        conn.close()
        self._conn = None

    def _commit(self, conn: sqlite3.Connection, batches: list[_Batch]) -> None:
        started = time.perf_counter()
        error = self._transaction(conn, batches)
        if error is not None and len(batches) > 1:
            # One bad batch must not fail its neighbours: retry each on its own.
            for batch in batches:
                self._finish([batch], self._transaction(conn, [batch]), started)
            return
        self._finish(batches, error, started)

    def _transaction(self, conn: sqlite3.Connection, batches: list[_Batch]) -> StoreError | None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                rows = EndState()
                for batch in batches:
                    rows.add_all(batch.records)
                rows.write(conn, self._stored)
                conn.execute("COMMIT")
                rows.settle(self._stored)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except Exception as exc:  # the writer thread must outlive any one commit
            log.error("store commit failed: %s", exc)
            self.stats.failures += 1
            self.stats.last_error = str(exc)
            return StoreError(f"the store {self.path} could not commit: {exc}")
        return None

    def _finish(self, batches: list[_Batch], error: StoreError | None, started: float) -> None:
        if error is None:
            self.stats.commits += 1
            self.stats.batches += len(batches)
            self.stats.records += sum(len(b.records) for b in batches)
            keep_recent(self.stats.commit_seconds, time.perf_counter() - started)
        # One wake-up per event loop for the whole commit, not one per batch.
        waiting: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for batch in batches:
            waiting.setdefault(batch.loop, []).append(batch.future)
        for loop, futures in waiting.items():
            loop.call_soon_threadsafe(_settle, futures, error)


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():  # the caller went away
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _drain(first: object, q: queue.SimpleQueue[object]) -> list[object]:
    items = [first]
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items
