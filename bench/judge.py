"""A minimal judge process for the benchmarks: fixed verdict, fixed latency, in-flight gauge.

``python -m bench.judge [--latency-ms L]`` serves ``POST /v1/responses`` and
``POST /v1/chat/completions`` with one GenRM-format verdict after ``L`` ms, on aiohttp
(one event loop, so it costs little CPU and has no thread-per-connection ceiling).
``GET /stats`` → ``{"requests", "in_flight", "max_in_flight", "by_path"}``;
``POST /stats/reset`` zeroes the counters (``max_in_flight`` restarts from the current
in-flight count). ``POST /record?n=N`` keeps the parsed bodies of the next ``N``
requests, ``GET /bodies`` returns them: the harness checks with it that the baseline
sends the very bodies the service sends. It prints ``bench-judge listening on HOST:PORT``
once bound.

It is not the project's ``genrm-grpc fake-judge`` (a thread-per-connection test double
with fault injection) on purpose: the benchmarks need a judge whose own cost and
concurrency limit stay out of the figures, and a max-in-flight counter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections import Counter
from typing import Any

from aiohttp import web

VERDICT_TEXT = (
    "Benchmark judge (a fixed verdict, not a model): response 1 is slightly better.\n"
    '```json\n{"score_1": 4, "score_2": 3, "ranking": 3}\n```'
)


def _responses_body() -> bytes:
    return json.dumps(
        {
            "id": "resp_bench",
            "object": "response",
            "model": "bench",
            "status": "completed",
            "incomplete_details": None,
            "output": [
                {
                    "id": "msg_bench",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": VERDICT_TEXT, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 100, "output_tokens": 40, "total_tokens": 140},
        }
    ).encode()


def _chat_body() -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "model": "bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": VERDICT_TEXT},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140},
        }
    ).encode()


class BenchJudge:
    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.by_path: Counter[str] = Counter()
        self.record_left = 0
        self.bodies: list[Any] = []
        self._answers = {"/v1/responses": _responses_body(), "/v1/chat/completions": _chat_body()}

    async def answer(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            raw = await request.read()
            if self.record_left > 0:
                self.record_left -= 1
                self.bodies.append(json.loads(raw))
            if self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            self.requests += 1
            self.by_path[request.path] += 1
            return web.Response(body=self._answers[request.path], content_type="application/json")
        finally:
            self.in_flight -= 1

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": self.requests,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "by_path": dict(self.by_path),
            }
        )

    async def reset(self, request: web.Request) -> web.Response:
        self.requests = 0
        self.max_in_flight = self.in_flight
        self.by_path.clear()
        return web.json_response({"ok": True})

    async def record(self, request: web.Request) -> web.Response:
        self.record_left = int(request.query.get("n", "64"))
        self.bodies = []
        return web.json_response({"ok": True})

    async def get_bodies(self, request: web.Request) -> web.Response:
        return web.json_response(self.bodies)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/responses", self.answer)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/stats/reset", self.reset)
        app.router.add_post("/record", self.record)
        app.router.add_get("/bodies", self.get_bodies)
        return app


async def serve(host: str, port: int, latency_s: float) -> None:
    runner = web.AppRunner(BenchJudge(latency_s).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"bench-judge listening on {host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.judge", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.latency_ms / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
