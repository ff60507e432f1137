"""A store file whose writes fail, over real gRPC, the HTTP fake judge and a SQLite file.

The fault is a real one from the kernel: the server's own file descriptors of the store
file and its WAL are replaced (``dup2``) by read-only descriptors of the same files, so
every write SQLite makes fails with an I/O error while reads go on; putting the original
descriptors back is the disk recovering. Nothing in the server is replaced or patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError

from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.sqlite import SqliteStore
from genrm_grpc.testing import FakeJudgeServer
from tests.server.conftest import StartServer, call_error

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
SIZE = 4  # circular: 4 passes


def _ref(k: int) -> pb.MemberRef:
    return pb.MemberRef(rollout_index=k, group_size=SIZE, group_id="disk", group_attempt=0)


def _answer(k: int) -> pb.Candidate:
    return pb.Candidate(output_text=f"answer {k}: {3 + 4 * k}")


def _descriptors(*paths: Path) -> list[int]:
    """This process's open descriptors of ``paths``."""
    wanted = {str(path) for path in paths}
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") in wanted:
                found.append(int(name))
    return found


@contextlib.contextmanager
def failing_disk(store: Path) -> Iterator[None]:
    """Every write to ``store`` and its WAL fails (EBADF → SQLite I/O error) inside."""
    fds = _descriptors(store, Path(f"{store}-wal"))
    assert fds, "the server has the store open"
    saved = {fd: os.dup(fd) for fd in fds}
    try:
        for fd in fds:
            read_only = os.open(os.readlink(f"/proc/self/fd/{fd}"), os.O_RDONLY)
            os.dup2(read_only, fd)
            os.close(read_only)
        yield
    finally:
        for fd, original in saved.items():
            os.dup2(original, fd)
            os.close(original)


def _count(store: Path, query: str) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0])


async def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll a condition on the file (the writer thread commits on its own schedule)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def _refused_for_the_store(client: CohortClient) -> None:
    """The last member, sent while the disk fails: STORE_UNAVAILABLE, never accepted."""
    try:
        await client.submit_member(_ref(SIZE - 1), PROMPT, _answer(SIZE - 1), timeout=60)
    except (CohortError, grpc.RpcError) as exc:
        details = call_error(exc)
        assert details.code is grpc.StatusCode.UNAVAILABLE, details
        assert details.reason == "STORE_UNAVAILABLE", details
    else:
        raise AssertionError("a member was accepted while its record was not stored")


@pytest.mark.stores("sqlite")
async def test_a_failing_disk_fails_the_member_it_cannot_write_and_its_resend_goes_on(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    """Nothing is held that the file lacks: the member whose
    commit fails is not in the group at all, so its resend after the disk recovers is
    what completes the group (and nothing was judged meanwhile)."""
    server, client = await start_server(genrm_parse_retries=0)
    shared = getattr(server.runtime, "shared", None)
    assert isinstance(shared, LocalGroups) and isinstance(shared.behind, SqliteStore)
    path = shared.behind.path.resolve()
    tombstones = "SELECT count(*) FROM tombstones"

    def submit(k: int) -> asyncio.Future[pb.MemberResult]:
        return asyncio.ensure_future(client.submit_member(_ref(k), PROMPT, _answer(k), timeout=60))

    first = [submit(k) for k in range(SIZE - 1)]
    await _until(lambda: _count(path, "SELECT count(*) FROM members") == SIZE - 1)

    with failing_disk(path):
        await _refused_for_the_store(client)
        assert server.runtime.stats()["store_failures"] >= 1
        # A single process's file does not turn readiness (docs/metrics.md): the
        # failure is counted and told to the call it failed, as under the registry.
        assert server.runtime.stats()["store_available"] == 1
        assert fake_judge.stats()["total"] == 0
        assert not any(call.done() for call in first)
        assert _count(path, "SELECT count(*) FROM members") == SIZE - 1
        assert _count(path, tombstones) == 0

    # The disk recovers: the resend is accepted, the group judged and published to the
    # members that kept waiting.
    last = await client.submit_member(_ref(SIZE - 1), PROMPT, _answer(SIZE - 1), timeout=60)
    results = await asyncio.gather(*first)
    assert not last.replayed and not last.mask_sample
    assert all(not r.replayed and not r.mask_sample for r in results)
    assert len({r.reward for r in [*results, last]}) > 1
    assert fake_judge.stats()["total"] == SIZE  # each pass judged once
    await _until(lambda: _count(path, tombstones) == 1)
    assert _count(path, "SELECT count(*) FROM members") == 0
