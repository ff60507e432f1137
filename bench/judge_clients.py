"""Judge HTTP clients compared: client CPU per judge call and judge saturation.

Separate processes, as in a deployment: the fake judge (``genrm-grpc fake-judge`` with a
fixed latency) runs in its own process, and each client under test runs in a fresh
worker process that keeps exactly C requests in flight (C coroutines, each sending its
next request when the previous answer arrived, so never more than C at once) for a
fixed time after a warm-up. The worker reports:

* **CPU per call**: the worker process's CPU time (user + system) / completed calls;
* **saturation**: achieved calls/s ÷ (C / L), where L is the judge latency. 1.0 means
  the client kept the judge as busy as C in-flight requests allow.

Every candidate does the same work per call: POST the same judge request (a Responses-API
body with two ~1 KiB answers), read the whole answer and decode its JSON. ``genrm`` is the
service's own ``JudgeClient.judge`` (retry bookkeeping and verdict parsing included).

    .venv/bin/python -m bench.judge_clients                 # every client, C = 16 64 256
    .venv/bin/python -m bench.judge_clients --clients aiohttp genrm --concurrency 64
    .venv/bin/python -m bench.judge_clients --judge fake canned

``--judge canned`` swaps the fake judge for a bench-only aiohttp server that returns one
pre-rendered answer after L: the threaded fake judge saturates one core near 1,500 calls/s,
below C/L at C = 256. The "judge CPU s/s" column shows the judge process's CPU seconds per
wall second (about 1.0 means the judge, not the client, is the limit).

The results go to stdout (a Markdown table) and, with ``--json PATH``, to a file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

CLIENTS = ("httpx", "httpx-tuned", "aiohttp", "genrm")
"""``httpx``: httpx as the service used it (one AsyncClient, pooled, its INFO request log
line on, and ``sniffio`` unimportable, as it was in the service's environment).
``httpx-tuned``: the same with ``sniffio`` importable and the request log off.
``aiohttp``: one ``aiohttp.ClientSession`` with a ``TCPConnector`` sized to C.
``genrm``: the service's ``JudgeClient`` (whatever library it is built on)."""

_CANNED_VERDICT = (
    "Response 1 answers the question directly; response 2 repeats it backwards.\n"
    '```json\n{"score_1": 5, "score_2": 2, "ranking": 1}\n```'
)
_ANSWER = "The answer is 42 because of the reasons laid out below. " * 18


def _payload() -> dict[str, Any]:
    return {
        "model": "genrm",
        "input": [
            {"role": "system", "content": "Be concise."},
            {"role": "user", "content": "What is the answer to everything?"},
        ],
        "metadata": {"response_1": _ANSWER, "response_2": _ANSWER[::-1]},
        "max_output_tokens": 1024,
    }


# -- worker side -------------------------------------------------------------------------


async def _drive(
    call: Callable[[], Awaitable[None]], concurrency: int, warmup_s: float, duration_s: float
) -> dict[str, float]:
    """Run ``concurrency`` request loops; measure CPU and calls over ``duration_s``."""
    counting = False
    calls = 0
    errors = 0
    in_flight = 0
    max_in_flight = 0
    stop = False

    async def loop() -> None:
        nonlocal calls, errors, in_flight, max_in_flight
        while not stop:
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            try:
                await call()
            except Exception:
                if counting:
                    errors += 1
            else:
                if counting:
                    calls += 1
            finally:
                in_flight -= 1

    tasks = [asyncio.create_task(loop()) for _ in range(concurrency)]
    await asyncio.sleep(warmup_s)
    counting = True
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(duration_s)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    counting = False
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "calls": calls,
        "errors": errors,
        "cpu_s": cpu1 - cpu0,
        "wall_s": wall1 - wall0,
        "max_in_flight": max_in_flight,
    }


async def _worker(kind: str, url: str, concurrency: int, warmup_s: float, duration_s: float) -> Any:
    endpoint = url.rstrip("/") + "/v1/responses"
    payload = _payload()
    if kind in ("httpx", "httpx-tuned"):
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0)) as client:

            async def call_httpx() -> None:
                response = await client.post(endpoint, json=payload)
                response.raise_for_status()
                json.loads(response.content)

            return await _drive(call_httpx, concurrency, warmup_s, duration_s)
    if kind == "aiohttp":
        import aiohttp

        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
        timeout = aiohttp.ClientTimeout(total=60.0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def call_aiohttp() -> None:
                async with session.post(endpoint, json=payload) as response:
                    response.raise_for_status()
                    json.loads(await response.read())

            return await _drive(call_aiohttp, concurrency, warmup_s, duration_s)
    if kind == "genrm":
        from genrm_grpc.config import JudgeSettings, Settings
        from genrm_grpc.judge.client import JudgeClient, JudgeInput

        config = Settings(
            judge=JudgeSettings(
                url=url, api="responses", model="genrm", max_connections=concurrency
            )
        )
        inp = JudgeInput(
            messages=(("system", "Be concise."), ("user", "What is the answer to everything?")),
            response_1=_ANSWER,
            response_2=_ANSWER[::-1],
        )
        async with JudgeClient(config) as judge:

            async def call_genrm() -> None:
                await judge.judge(inp)

            return await _drive(call_genrm, concurrency, warmup_s, duration_s)
    raise SystemExit(f"unknown client {kind!r}")


def _worker_main(args: argparse.Namespace) -> None:
    if args.worker == "httpx":
        # As the service ran: sniffio not importable, httpx's INFO request line formatted
        # as JSON and written out (here to /dev/null).
        sys.modules["sniffio"] = None  # type: ignore[assignment]
        from genrm_grpc.logs import JsonFormatter

        handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=logging.INFO, handlers=[handler])
    result = asyncio.run(
        _worker(args.worker, args.url, args.concurrency[0], args.warmup_s, args.duration_s)
    )
    print(json.dumps(result), flush=True)


# -- canned judge (optional) --------------------------------------------------------------


def _serve_canned(port: int, latency_ms: float) -> None:
    """An aiohttp judge that answers every POST with one fake-judge answer after L ms.

    For when the fake judge (a threaded test double) cannot keep C/L calls/s busy: it
    shows what the client does when the judge is not the bottleneck.
    """
    from aiohttp import web

    answer = json.dumps(
        {
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "content": [
                        {
                            "type": "output_text",
                            "text": _CANNED_VERDICT,
                        }
                    ],
                }
            ],
            "usage": {"input_tokens": 500, "output_tokens": 100},
        }
    ).encode()

    async def judge(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(latency_ms / 1000.0)
        return web.Response(body=answer, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/responses", judge)
    print(f"canned judge listening on http://127.0.0.1:{port}", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


# -- driver side -------------------------------------------------------------------------


_PY = (sys.executable, "-m")


def _start_judge(kind: str, latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    if kind == "fake":
        args = [*_PY, "genrm_grpc.cli", "fake-judge", "--port", "0"]
    else:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        args = [*_PY, "bench.judge_clients", "--serve-canned", str(port)]
    proc = subprocess.Popen(
        [*args, "--latency-ms", f"{latency_ms:g}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"fake judge did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    judge_kind: str,
    clients: list[str],
    concurrencies: list[int],
    latency_ms: float,
    warmup_s: float,
    duration_s: float,
) -> list[dict[str, Any]]:
    judge, url = _start_judge(judge_kind, latency_ms)
    rows: list[dict[str, Any]] = []
    try:
        for concurrency in concurrencies:
            for kind in clients:
                judge_cpu0, wall0 = _cpu_s(judge.pid), time.perf_counter()
                out = subprocess.run(
                    [
                        *_PY,
                        "bench.judge_clients",
                        *("--worker", kind, "--url", url, "--concurrency", str(concurrency)),
                        *("--warmup-s", str(warmup_s), "--duration-s", str(duration_s)),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                judge_busy = (_cpu_s(judge.pid) - judge_cpu0) / (time.perf_counter() - wall0)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                rate = result["calls"] / result["wall_s"]
                ideal = concurrency / (latency_ms / 1000.0)
                row = {
                    "judge": judge_kind,
                    "judge_cpu_per_s": judge_busy,
                    "client": kind,
                    "concurrency": concurrency,
                    "latency_ms": latency_ms,
                    **result,
                    "calls_per_s": rate,
                    "cpu_us_per_call": 1e6 * result["cpu_s"] / max(1, result["calls"]),
                    "saturation": rate / ideal,
                }
                rows.append(row)
                print(
                    f"{kind:12s} C={concurrency:<4d} {rate:8.1f} calls/s  "
                    f"saturation {row['saturation']:.2f}  "
                    f"CPU {row['cpu_us_per_call']:7.0f} µs/call  "
                    f"errors {result['errors']}  max in flight {result['max_in_flight']}  "
                    f"judge CPU {judge_busy:.2f} s/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        judge.terminate()
        judge.wait(10)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| judge | client | C | calls/s | saturation | client CPU µs/call | judge CPU s/s "
        "| errors |",
        "| :-- | :-- | --: | --: | --: | --: | --: | --: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['judge']} | {r['client']} | {r['concurrency']} | {r['calls_per_s']:.0f} | "
            f"{r['saturation']:.2f} | {r['cpu_us_per_call']:.0f} | "
            f"{r['judge_cpu_per_s']:.2f} | {r['errors']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.judge_clients", description=__doc__)
    parser.add_argument(
        "--judge",
        nargs="+",
        default=["fake"],
        choices=["fake", "canned"],
        help="fake: genrm-grpc fake-judge; canned: an aiohttp server with one fixed answer",
    )
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[16, 64, 256])
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-canned", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_canned is not None:
        _serve_canned(args.serve_canned, args.latency_ms)
        return
    if args.worker is not None:
        _worker_main(args)
        return
    rows = [
        row
        for judge in args.judge
        for row in run(
            judge, args.clients, args.concurrency, args.latency_ms, args.warmup_s, args.duration_s
        )
    ]
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
