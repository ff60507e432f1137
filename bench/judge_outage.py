"""Masked share of 16-member groups under judge faults, with and without outage tolerance.

Real processes on loopback: the fake judge (``genrm-grpc fake-judge``, fixed latency) on
a fixed port, the server (``genrm-grpc serve``) configured through ``GENRM_*``, and this
driver streaming G groups of 16 members (circular: 16 comparisons per group) with a
bounded number of groups in flight. A group counts as masked when its members come back
with ``mask_sample``. Two fault scenarios, each run for every server variant:

* ``hang``: the judge never answers a share of requests (``--hang-rate``, default 0.5 %);
  ``judge_request_timeout_s`` ends them.
* ``restart``: the judge process is stopped after ``--outage-at-s`` and started again on
  the same port ``--outage-s`` (default 3 s) later.

Variants: ``off`` (``judge_outage_tolerance_s: 0``, NeMo Gym's behaviour),
``tolerance`` (``judge_outage_tolerance_s`` = ``--tolerance-s``) and ``tolerance+hedge``
(also ``judge_hedge_after_s`` = ``--hedge-after-s``).

    .venv/bin/python -m bench.judge_outage                  # both scenarios, 3 variants
    .venv/bin/python -m bench.judge_outage --groups 200 --scenarios restart
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError

_PY = (sys.executable, "-m", "genrm_grpc.cli")
GROUP_SIZE = 16
VARIANTS = ("off", "tolerance", "tolerance+hedge")
SCENARIOS = ("hang", "restart")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(args: list[str], ready: str, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if ready not in line:
        proc.kill()
        raise SystemExit(f"{args[3]} did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def _stop(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _judge(port: int, latency_ms: float, hang_rate: float, seed: int) -> Any:
    args = [*_PY, "fake-judge", "--port", str(port), "--latency-ms", f"{latency_ms:g}"]
    args += ["--hang-rate", str(hang_rate), "--seed", str(seed)]
    return _start(args, "listening on")[0]


async def _group(client: CohortClient, n: int, run: str) -> bool:
    """Stream one 16-member group; True when it came back masked."""
    prompt = pb.Prompt(messages=[pb.ChatMessage(role="user", content=f"Question {n}: why?")])
    requests = [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(
                group_id=f"{run}-{n}", group_attempt=0, rollout_index=k, group_size=GROUP_SIZE
            ),
            prompt=prompt,
            candidate=pb.Candidate(output_text=f"Answer {k} to question {n}: " + "because " * k),
        )
        for k in range(GROUP_SIZE)
    ]
    try:
        events = [e async for e in client.stream_groups(requests, timeout=600)]
    except CohortError:
        return True
    results = [e.result for e in events if e.WhichOneof("event") == "result"]
    return len(results) != GROUP_SIZE or any(r.mask_sample for r in results)


async def _drive(target: str, groups: int, in_flight: int, run: str) -> int:
    masked = 0
    sem = asyncio.Semaphore(in_flight)

    async def one(n: int) -> None:
        nonlocal masked
        async with sem:
            if await _group(client, n, run):
                masked += 1

    async with CohortClient(target) as client:
        await asyncio.gather(*(one(n) for n in range(groups)))
    return masked


def run_one(args: argparse.Namespace, scenario: str, variant: str) -> dict[str, Any]:
    port = _free_port()
    hang_rate = args.hang_rate if scenario == "hang" else 0.0
    judge = _judge(port, args.latency_ms, hang_rate, args.seed)
    env = {
        "GENRM_JUDGE__URL": f"http://127.0.0.1:{port}",
        "GENRM_JUDGE_REQUEST_TIMEOUT_S": str(args.request_timeout_s),
        "GENRM_JUDGE_MAX_CONCURRENCY": str(args.judge_concurrency),
        "GENRM_NUM_ROLLOUTS_PER_PROMPT": str(GROUP_SIZE),
        "GENRM_LOG_LEVEL": "ERROR",
        "GENRM_JUDGE_OUTAGE_TOLERANCE_S": "0" if variant == "off" else str(args.tolerance_s),
    }
    if variant == "tolerance+hedge":
        env["GENRM_JUDGE_HEDGE_AFTER_S"] = str(args.hedge_after_s)
    server, target = _start([*_PY, "serve", "--listen", "127.0.0.1:0"], "serving on", env)
    judges = [judge]
    try:

        async def main() -> int:
            drive = asyncio.create_task(
                _drive(target, args.groups, args.groups_in_flight, f"{scenario}-{variant}")
            )
            if scenario == "restart":
                await asyncio.sleep(args.outage_at_s)
                await asyncio.to_thread(_stop, judges[0])
                await asyncio.sleep(args.outage_s)
                judges[0] = await asyncio.to_thread(_judge, port, args.latency_ms, 0.0, args.seed)
            return await drive

        started = time.perf_counter()
        masked = asyncio.run(main())
        elapsed = time.perf_counter() - started
    finally:
        _stop(server)
        _stop(judges[0])
    row = {
        "scenario": scenario,
        "variant": variant,
        "groups": args.groups,
        "masked": masked,
        "masked_share": masked / args.groups,
        "seconds": elapsed,
    }
    print(
        f"{scenario:8s} {variant:16s} masked {masked}/{args.groups} "
        f"({100 * row['masked_share']:.1f} %) in {elapsed:.1f}s",
        file=sys.stderr,
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.judge_outage", description=__doc__)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--groups", type=int, default=120)
    parser.add_argument("--groups-in-flight", type=int, default=8)
    parser.add_argument("--judge-concurrency", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--hang-rate", type=float, default=0.005)
    parser.add_argument("--request-timeout-s", type=float, default=2.0)
    parser.add_argument("--outage-at-s", type=float, default=1.0)
    parser.add_argument("--outage-s", type=float, default=3.0)
    parser.add_argument("--tolerance-s", type=float, default=10.0)
    parser.add_argument("--hedge-after-s", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = [run_one(args, s, v) for s in args.scenarios for v in args.variants]
    print("| scenario | variant | groups | masked | masked share |")
    print("| :-- | :-- | --: | --: | --: |")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['variant']} | {r['groups']} | {r['masked']} | "
            f"{100 * r['masked_share']:.1f} % |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
