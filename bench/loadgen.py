"""The load generator process of the multi-process benchmark.

``python -m bench.loadgen`` reads one JSON command per line on stdin and answers one JSON
line on stdout, keeping one gRPC channel per target open between commands (so a warm-up
command really warms the next run). A command::

    {"target": "127.0.0.1:PORT", "api": "SubmitMember" | "StreamGroups",
     "prefix": "run-3", "size": 16, "in_flight": 32, "answer_bytes": 2048,
     "groups": 96}            # or "duration_s": 4.0 (groups are started until then)

runs groups of ``size`` members, ``in_flight`` groups at a time (SubmitMember: one call
per member, all members of a group concurrently; StreamGroups: one stream per group).
With ``"targets": [A, B, C]`` instead of ``"target"`` (replicas sharing a store), member
``i`` of every group goes to ``targets[i % len(targets)]`` (StreamGroups: one stream per
target and group, each carrying its share of the members, all opened at once),
and answers ``{"groups", "members", "elapsed_s", "members_per_s", "member_p50_ms",
"member_p99_ms", "member_max_ms", "group_p50_ms", "group_p99_ms", "errors",
"masked", "latencies_ms"}`` (``latencies_ms`` only with ``"keep_latencies": true``;
with ``"group_metrics": true`` also ``group_metrics``, every answered group's
``group_metrics`` summed over the groups, taken from one member of each, and
``groups_with_metrics``).
A member's latency is from sending it (its stream's opening) to its result.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from bench.util import percentile

PROMPT_TEXT = "Explain, step by step, why the sum of two even numbers is even."
WORDS = (
    "the answer considers each step carefully and explains why the result holds "
    "for every case that the question mentions, with a short example "
)


def answer_text(n: int, i: int, size: int) -> str:
    """A distinct answer of exactly ``size`` characters."""
    head = f"group {n} member {i}: "
    return (head + WORDS * (size // len(WORDS) + 2))[:size]


def group_requests(
    prefix: str, n: int, size: int, answer_bytes: int, prompt_words: int = 0
) -> list[pb.SubmitMemberRequest]:
    # prompt_words > 0: a longer question (the shared prefix a judge's cache can hold).
    context = "".join(f"fact{n}-{w} " for w in range(prompt_words))
    prompt = pb.Prompt(
        messages=[
            pb.ChatMessage(role="system", content="You are a careful assistant."),
            pb.ChatMessage(role="user", content=f"Question {n}: {context}{PROMPT_TEXT}"),
        ]
    )
    return [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(
                group_id=f"{prefix}-{n}", group_attempt=0, rollout_index=i, group_size=size
            ),
            prompt=prompt,
            candidate=pb.Candidate(output_text=answer_text(n, i, answer_bytes)),
        )
        for i in range(size)
    ]


class Runner:
    def __init__(self) -> None:
        self.stubs: dict[str, Any] = {}

    def stub(self, target: str) -> Any:
        if target not in self.stubs:
            channel = grpc.aio.insecure_channel(
                target, options=[("grpc.max_receive_message_length", 64 * 2**20)]
            )
            self.stubs[target] = pb_grpc.CohortServiceStub(channel)
        return self.stubs[target]

    async def run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        stubs = [self.stub(t) for t in cmd.get("targets") or [cmd["target"]]]
        stub = stubs[0]
        api, size, prefix = cmd["api"], int(cmd["size"]), str(cmd["prefix"])
        answer_bytes = int(cmd.get("answer_bytes", 2048))
        prompt_words = int(cmd.get("prompt_words", 0))
        in_flight = int(cmd["in_flight"])
        groups = cmd.get("groups")
        duration = cmd.get("duration_s")
        timeout = float(cmd.get("timeout_s", 120.0))
        perf = time.perf_counter
        member_lat: list[float] = []
        group_lat: list[float] = []
        counts = {"errors": 0, "masked": 0, "members": 0, "groups": 0}
        first_error: list[str] = []
        if groups is not None:  # built before the clock starts
            prebuilt = [
                group_requests(prefix, n, size, answer_bytes, prompt_words) for n in range(groups)
            ]

        sum_groups = bool(cmd.get("group_metrics"))
        group_sums: dict[str, float] = {}
        summed: set[str] = set()

        def note(result: pb.MemberResult) -> None:
            counts["members"] += 1
            if result.mask_sample:
                counts["masked"] += 1
            if sum_groups and result.member.group_id not in summed:
                summed.add(result.member.group_id)  # every member carries its group's
                for key, value in result.group_metrics.items():
                    group_sums[key] = group_sums.get(key, 0.0) + value

        def failed(exc: BaseException) -> None:
            counts["errors"] += 1
            if not first_error:
                first_error.append(repr(exc)[:300])

        async def unary(reqs: list[pb.SubmitMemberRequest]) -> None:
            async def one(i: int, req: pb.SubmitMemberRequest) -> None:
                t0 = perf()
                try:
                    resp = await stubs[i % len(stubs)].SubmitMember(req, timeout=timeout)
                except grpc.RpcError as exc:
                    failed(exc)
                    return
                member_lat.append(perf() - t0)
                note(resp.result)

            await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))

        async def stream(reqs: list[pb.SubmitMemberRequest]) -> None:
            if len(stubs) == 1:
                await stream_to(stub, reqs)
                return
            shares = [reqs[k :: len(stubs)] for k in range(len(stubs))]
            await asyncio.gather(
                *(stream_to(s, m) for s, m in zip(stubs, shares, strict=True) if m)
            )

        async def stream_to(to: Any, reqs: list[pb.SubmitMemberRequest]) -> None:
            t0 = perf()
            try:
                call = to.StreamGroups(
                    iter([pb.StreamGroupsRequest(member=r) for r in reqs]), timeout=timeout
                )
                async for event in call:
                    kind = event.WhichOneof("event")
                    if kind == "result":
                        member_lat.append(perf() - t0)
                        note(event.result)
                    elif kind == "error":
                        failed(RuntimeError(str(event.error)))
            except grpc.RpcError as exc:
                failed(exc)

        send = unary if api == "SubmitMember" else stream
        started = perf()
        deadline = started + float(duration) if duration is not None else math.inf
        next_group = 0
        lock = asyncio.Lock()

        async def worker() -> None:
            nonlocal next_group
            while True:
                async with lock:
                    n = next_group
                    if groups is not None and n >= groups:
                        return
                    if groups is None and perf() >= deadline:
                        return
                    next_group += 1
                reqs = prebuilt[n] if groups is not None else None
                if reqs is None:
                    reqs = group_requests(prefix, n, size, answer_bytes, prompt_words)
                g0 = perf()
                await send(reqs)
                group_lat.append(perf() - g0)
                counts["groups"] += 1

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = perf() - started
        out: dict[str, Any] = {
            **counts,
            "elapsed_s": elapsed,
            "members_per_s": counts["members"] / elapsed if elapsed else math.nan,
            "member_p50_ms": percentile(member_lat, 0.5) * 1e3,
            "member_p99_ms": percentile(member_lat, 0.99) * 1e3,
            "member_max_ms": max(member_lat, default=math.nan) * 1e3,
            "group_p50_ms": percentile(group_lat, 0.5) * 1e3,
            "group_p99_ms": percentile(group_lat, 0.99) * 1e3,
            "first_error": first_error[0] if first_error else None,
        }
        if sum_groups:
            out["group_metrics"] = group_sums
            out["groups_with_metrics"] = len(summed)
        if cmd.get("keep_latencies"):
            out["latencies_ms"] = [round(x * 1e3, 3) for x in member_lat]
        return out


async def main_async() -> None:
    runner = Runner()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := await reader.readline():
        cmd = json.loads(line)
        try:
            result = await runner.run(cmd)
        except Exception as exc:  # reported to the harness, which fails the section
            result = {"exception": repr(exc)}
        print(json.dumps(result), flush=True)


def main() -> int:
    asyncio.run(main_async())
    return 0


if __name__ == "__main__":
    sys.exit(main())
