"""Server CPU per member: StreamGroups vs SubmitMember, in separate processes.

Starts the fake judge and the server as their own processes, drives them from this
process over loopback gRPC, and reads the server's CPU time (user + system, from
/proc/PID/stat) before and after each run. Runs alternate (ABAB) so that background
load on a shared machine hits both transports alike.

    .venv/bin/python tools/stream_cpu.py --groups 200 --group-size 16 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

PY = [sys.executable, "-m", "genrm_grpc.cli"]
PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Explain unit testing briefly.")])
TICKS = os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def process(args: list[str], ready: str) -> Iterator[tuple[int, str]]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith(ready):
            raise RuntimeError(f"{args[3]} did not start: {line!r}")
        yield proc.pid, line[len(ready) :].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def requests(run: str, group: int, size: int) -> list[pb.SubmitMemberRequest]:
    return [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(
                group_id=f"{run}/{group}", group_attempt=0, rollout_index=k, group_size=size
            ),
            prompt=PROMPT,
            candidate=pb.Candidate(output_text=f"Answer {k}: unit tests check small pieces."),
        )
        for k in range(size)
    ]


async def unary(stub: pb_grpc.CohortServiceStub, run: str, groups: range, size: int) -> None:
    for g in groups:
        await asyncio.gather(*(stub.SubmitMember(r, timeout=600) for r in requests(run, g, size)))


async def stream(stub: pb_grpc.CohortServiceStub, run: str, groups: range, size: int) -> None:
    call = stub.StreamGroups(timeout=600)
    for g in groups:
        for r in requests(run, g, size):
            await call.write(pb.StreamGroupsRequest(member=r))
        outcomes = 0
        while outcomes < size:
            event = await call.read()
            if event.WhichOneof("event") in ("result", "error"):
                outcomes += 1
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass


async def drive(target: str, kind: str, run: str, groups: int, size: int, workers: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        work = unary if kind == "unary" else stream
        per = groups // workers
        await asyncio.gather(
            *(work(stub, run, range(w * per, (w + 1) * per), size) for w in range(workers))
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra `genrm-grpc serve` argument"
    )
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"unary": [], "stream": []}
    with (
        process([*PY, "fake-judge", "--port", "0"], "fake-judge listening on") as (_, url),
        process(
            [
                *PY,
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--judge-url",
                url,
                "--log-level",
                "WARNING",
                *args.serve_arg,
            ],
            "genrm-grpc serving on",
        ) as (pid, target),
    ):
        for n in range(args.rounds):
            for kind in ("unary", "stream"):
                before = cpu_seconds(pid)
                asyncio.run(
                    drive(target, kind, f"{kind}-{n}", args.groups, args.group_size, args.workers)
                )
                members = args.groups // args.workers * args.workers * args.group_size
                figures[kind].append((cpu_seconds(pid) - before) / members * 1e6)
    for kind, values in figures.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(
            f"{kind:6} server CPU per member: median {statistics.median(values):.0f} µs "
            f"(rounds: {shown}; group size {args.group_size})"
        )


if __name__ == "__main__":
    main()
