"""StreamGroups backpressure against a real server process.

A client that writes but never reads must not grow the server's memory: the server
stops reading once its output buffer is full, gRPC flow control then blocks the client's
writes, and once the client reads again every member it wrote gets its events.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

# On each kind of store (tests/store_kinds.py): the server process inherits GENRM_STORE.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("store_of_kind")]

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Say something.")])
#: One-member groups complete at once without a judge call; long ids make every event
#: about 1 KB, so an unbounded buffer would show in the server's RSS at once.
ID_PAD = "p" * 480
ANSWER = "a" * 4096
#: Far more than flow control and the buffer can hold (about 0.5 GB of requests).
MAX_WRITES = 100_000
#: A write that has not completed in this long is blocked by flow control (on an idle
#: machine an unblocked write takes well under a millisecond).
STALL_S = 10.0
RSS_GROWTH_LIMIT = 96 * 1024 * 1024


def _request(n: int) -> pb.StreamGroupsRequest:
    return pb.StreamGroupsRequest(
        member=pb.SubmitMemberRequest(
            member=pb.MemberRef(
                group_id=f"{ID_PAD}-{n}", group_attempt=0, rollout_index=0, group_size=1
            ),
            prompt=PROMPT,
            candidate=pb.Candidate(output_text=f"{n} {ANSWER}"),
        )
    )


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server() -> Iterator[tuple[int, str]]:
    env = {**os.environ, "GENRM_STREAM_MAX_BUFFERED_EVENTS": "64"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "genrm_grpc.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--judge-url",
            "http://127.0.0.1:9",  # never called: one-member groups need no judge
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("genrm-grpc serving on"), line
        yield proc.pid, line.rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _non_reading_client(pid: int, target: str) -> tuple[int, int, dict[str, int], int]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        # Warm up (imports, first call) before the baseline is taken.
        await stub.StreamGroups(iter([_request(-1)]), timeout=60).read()
        baseline = _rss(pid)
        call = stub.StreamGroups(timeout=600)
        written = 0
        stalled_write: asyncio.Task[None] | None = None
        while written < MAX_WRITES:
            write = asyncio.ensure_future(call.write(_request(written)))
            done, _ = await asyncio.wait({write}, timeout=STALL_S)
            if not done:
                stalled_write = write
                break
            write.result()
            written += 1
        grown = _rss(pid) - baseline
        # Now read: the blocked write completes, and every member written gets both
        # its acceptance and its result, exactly once.
        counts = {"accepted": 0, "result": 0, "error": 0}

        async def read_all() -> None:
            while (event := await call.read()) is not grpc.aio.EOF:
                counts[event.WhichOneof("event")] += 1

        reader = asyncio.create_task(read_all())
        if stalled_write is not None:
            await stalled_write
            written += 1
        await call.done_writing()
        await reader
        assert await call.code() == grpc.StatusCode.OK
    return written, grown, counts, baseline


def test_a_client_that_never_reads_is_blocked_by_flow_control_and_server_memory_stays_bounded(
    server: tuple[int, str],
) -> None:
    pid, target = server
    written, grown, counts, _ = asyncio.run(_non_reading_client(pid, target))
    assert written < MAX_WRITES, "the server kept reading although nobody read its events"
    assert grown < RSS_GROWTH_LIMIT, f"server RSS grew by {grown / 2**20:.0f} MiB"
    assert counts == {"accepted": written, "result": written, "error": 0}
