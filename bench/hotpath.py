"""Service code per member, in one process, without gRPC (run by hand; not in ``make bench``).

``python -m bench.hotpath [--members N] [--repeats R] [--profile CASE] [--store S]`` drives
the server's own ``CohortServicer`` (built by ``CohortServer`` from ``Settings``, store
``memory://`` or, with ``--store sqlite``, a fresh SQLite file; the writer thread's CPU
counts, as process time) the way grpc.aio would, minus gRPC: ``SubmitMember`` is awaited with a
stand-in servicer context, a StreamGroups stream runs ``GroupStream`` over an async
iterator of requests with a list as its writer. The judge is ``bench.service``'s
in-process ``InstantJudge``, so no HTTP either. What is left is the work a member costs
in the service's own code: validation and digests, the group store and its decisions,
the runtime's waiters, pair tasks and scoring, and building the results.

Cases: 1-member groups (SubmitMember, StreamGroups) and 16-member groups (circular,
SubmitMember and StreamGroups). Figures are process CPU time per member, the minimum of
``R`` repeats (the least disturbed one on a shared machine). ``--profile CASE`` prints a
cProfile of that case instead. The multi-process sections of ``make bench`` measure the
same code behind real gRPC and HTTP; this isolates the part of their figure that is ours.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from genrm.cohort.v1 import cohort_pb2 as pb

from bench.loadgen import group_requests
from bench.service import InstantJudge
from genrm_grpc.config import Settings
from genrm_grpc.server.app import CohortServer
from genrm_grpc.server.group_stream import GroupStream

ANSWER_BYTES = 2048
CASES = ("submit-1", "stream-1", "submit-16", "stream-16")


class _Context:
    """What SubmitMember reads of a grpc.aio servicer context (a client deadline set)."""

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, *args: Any) -> None:
        raise RuntimeError(f"aborted: {args}")

    async def send_initial_metadata(self, metadata: Any) -> None:
        """The servicer names its instance in the initial metadata; nobody reads it here."""

    def set_trailing_metadata(self, metadata: Any) -> None:
        """... and in the trailing metadata; nobody reads it here either."""

    def trailing_metadata(self) -> Any:
        return ()


def _server(store: str) -> CohortServer:
    settings = Settings(
        store=store,
        log_level="WARNING",
        default_principle="Prefer the correct answer.",
        comparison_strategy="circular",
        num_rollouts_per_prompt=16,
        max_terminal_cohorts=1_000_000,
    )
    # An instant judge, no HTTP: the service's own work only.
    server = CohortServer(settings, judge_backend=InstantJudge())
    return server


def _driver(server: CohortServer, case: str) -> Callable[[list[Any]], Awaitable[object]]:
    servicer = server.servicer
    context = _Context()

    async def submit(group: list[Any]) -> object:
        return await asyncio.gather(*(servicer.SubmitMember(r, context) for r in group))

    async def stream(group: list[Any]) -> object:
        async def requests() -> AsyncIterator[pb.StreamGroupsRequest]:
            for request in group:
                yield pb.StreamGroupsRequest(member=request)

        events: list[pb.StreamGroupsResponse] = []

        async def write(event: pb.StreamGroupsResponse) -> None:
            events.append(event)

        await GroupStream(servicer, requests(), "bench", "").run(write)
        return events

    return submit if case.startswith("submit") else stream


async def _measure(case: str, members: int, profile: bool, store: str = "memory://") -> float:
    size = int(case.rsplit("-", 1)[1])
    in_flight = 128 if size == 1 else 8  # groups at a time, as in make bench
    server = _server(store)
    await server.runtime.open()
    run = _driver(server, case)
    for n in range(200 // size + 10):  # warm-up: code paths, caches
        await run(group_requests("warm", n, size, ANSWER_BYTES))
    groups = [group_requests("run", n, size, ANSWER_BYTES) for n in range(members // size)]
    profiler = cProfile.Profile() if profile else None
    gc.collect()
    started = time.process_time()
    if profiler is not None:
        profiler.enable()
    for first in range(0, len(groups), in_flight):
        await asyncio.gather(*(run(g) for g in groups[first : first + in_flight]))
    if profiler is not None:
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(r"genrm_grpc", 40)
    spent = time.process_time() - started
    await server.runtime.shutdown(0.0)
    return spent / (len(groups) * size) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__)
    parser.add_argument("--members", type=int, default=16_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", choices=CASES)
    parser.add_argument(
        "--store",
        choices=("memory", "sqlite"),
        default="memory",
        help="memory:// or a fresh SQLite file (the default store) per run",
    )
    args = parser.parse_args(argv)

    def measure(case: str, profile: bool) -> float:
        if args.store == "memory":
            return asyncio.run(_measure(case, args.members, profile))
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/hotpath.sqlite"
            return asyncio.run(_measure(case, args.members, profile, url))

    if args.profile:
        measure(args.profile, True)
        return 0
    out: dict[str, float] = {}
    for case in CASES:
        runs = [measure(case, False) for _ in range(args.repeats)]
        out[case] = round(min(runs), 1)
        print(f"{case}: {out[case]} µs of service code per member (min of {runs})", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
