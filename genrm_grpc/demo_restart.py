"""Act 4 of ``genrm-grpc demo``: a restart that loses nothing.

A group is submitted to a ``genrm-grpc serve`` process in front of a slow fake judge,
the server is SIGKILLed once its store file holds some journaled verdicts, started again
on the same file, and the members are resent: only the passes the journal lacked are
judged, and an identical resend after completion costs no judge call. Every figure of
the ``RestartReport`` is counted, none is assumed (``tests/e2e/test_demo.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.demo import ANSWERS, _process, _short, load_prompts, to_prompt

RESTART_GROUP = "demo-restart"
RESTART_ANSWERS = ANSWERS[4]  # four answers: circular pairs → four judge passes


@dataclass(frozen=True)
class RestartReport:
    """What :func:`restart_act` saw; every figure is counted, none is assumed."""

    passes: int  # judge passes the group needs
    journaled: list[tuple[int, int]]  # pairs whose verdict was in the store at the kill
    requests_before_kill: int  # judge requests received before the kill
    killed_calls: list[str]  # what each waiting SubmitMember call saw
    restart_s: float  # exec of the new server process → serving
    requests_after_restart: int  # judge requests for the resent members
    resumed: list[int]  # judge_passes_resumed of each result
    rewards: list[float]
    masked: list[bool]
    requests_on_resend: int  # judge requests for an identical resend after completion
    replayed: list[bool]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _judge_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as reply:
        stats: dict[str, Any] = json.loads(reply.read())
    return int(stats["total"])


def _journaled(store: Path) -> list[tuple[int, int]]:
    """The pairs journaled so far, read with a second connection (WAL allows it)."""
    if not store.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        try:
            rows = conn.execute("SELECT response_i, response_j FROM verdicts").fetchall()
        except sqlite3.OperationalError:  # the schema is not written yet
            return []
    return sorted((int(i), int(j)) for i, j in rows)


class _Server:
    """``genrm-grpc serve`` on a fixed port over one store file: started, killed, started."""

    def __init__(self, store: Path, judge_url: str) -> None:
        self.target = f"127.0.0.1:{_free_port()}"
        self.args = [
            *[sys.executable, "-m", "genrm_grpc.cli", "serve", "--listen", self.target],
            *["--judge-url", judge_url, "--num-rollouts-per-prompt", "4"],
            *["--judge-max-concurrency", "2", "--log-level", "ERROR"],
        ]
        self.env = {**os.environ, "GENRM_STORE": f"sqlite:///{store}"}
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> float:
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("genrm-grpc serving on"):
            self.stop()
            raise RuntimeError(f"the server did not start (said {line!r})")
        return time.perf_counter() - started

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._forget()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._forget()

    def _forget(self) -> None:
        """The process is gone: close the pipe its readiness line came on."""
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


def _restart_requests(prompt: pb.Prompt) -> list[pb.SubmitMemberRequest]:
    return [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(
                group_id=RESTART_GROUP, group_attempt=0, rollout_index=k, group_size=4
            ),
            prompt=prompt,
            candidate=pb.Candidate(output_text=answer),
        )
        for k, answer in enumerate(RESTART_ANSWERS)
    ]


async def _submit_group(target: str, requests: list[pb.SubmitMemberRequest]) -> list[Any]:
    """All members at once on a plain stub (no client-side retry: the demo resends)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.CohortServiceStub(channel)
        calls = [stub.SubmitMember(r, timeout=60) for r in requests]
        return list(await asyncio.gather(*calls, return_exceptions=True))


async def _until_journaled(store: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(await asyncio.to_thread(_journaled, store)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("no judge pass was journaled in time")
        await asyncio.sleep(0.01)


async def _restart_story(server: _Server, judge_url: str, store: Path) -> RestartReport:
    requests = _restart_requests(to_prompt(load_prompts()[4]))
    passes = len(requests)
    waiting = asyncio.ensure_future(_submit_group(server.target, requests))
    # Two judge permits and a slow judge: passes finish two at a time. Kill the server
    # once two verdicts are in the file, while the next two are being judged.
    await _until_journaled(store, 2)
    server.kill()
    journaled = _journaled(store)
    before = _judge_requests(judge_url)
    killed = [r.code().name if isinstance(r, grpc.RpcError) else "answered" for r in await waiting]
    restart_s = await asyncio.to_thread(server.start)
    results = await _submit_group(server.target, requests)  # the identical resend
    for r in results:
        if isinstance(r, BaseException):
            raise r
    after = _judge_requests(judge_url)
    again = await _submit_group(server.target, requests)  # once more, after completion
    for r in again:
        if isinstance(r, BaseException):
            raise r
    return RestartReport(
        passes=passes,
        journaled=journaled,
        requests_before_kill=before,
        killed_calls=killed,
        restart_s=restart_s,
        requests_after_restart=after - before,
        resumed=[r.result.judge_passes_resumed for r in results],
        rewards=[r.result.reward for r in results],
        masked=[r.result.mask_sample for r in results],
        requests_on_resend=_judge_requests(judge_url) - after,
        replayed=[r.result.replayed for r in again],
    )


def restart_act(store_dir: Path, judge_latency_ms: int = 400) -> RestartReport:
    """Act 4: SIGKILL mid-evaluation, restart on the same store file, resend."""
    store = store_dir / "restart-demo.sqlite3"
    py = [sys.executable, "-m", "genrm_grpc.cli"]
    slow_judge = [*py, "fake-judge", "--port", "0", "--latency-ms", str(judge_latency_ms)]
    with _process(slow_judge, "fake-judge listening on") as (_, judge_url):
        server = _Server(store, judge_url)
        server.start()
        try:
            return asyncio.run(_restart_story(server, judge_url, store))
        finally:
            server.stop()


def print_restart(report: RestartReport, judge_latency_ms: int) -> None:
    n, j = report.passes, len(report.journaled)
    print("\n== A restart that loses nothing: SIGKILL mid-evaluation, same store file ==")
    print(
        f"  a group of {n} members sent with SubmitMember ({n} judge passes); the fake judge "
        f"now takes\n  {judge_latency_ms} ms per verdict and the server judges 2 at a time"
    )
    pairs = ", ".join(f"({i}, {k})" for i, k in report.journaled)
    print(f"  SIGKILL the server once the store file holds verdicts: {j} journaled, {pairs}")
    print(
        f"  the judge had received {report.requests_before_kill} requests; "
        f"{report.requests_before_kill - j} of them were in flight and are lost with the "
        "process"
    )
    calls = ", ".join(sorted(set(report.killed_calls)))
    print(f"  the {len(report.killed_calls)} waiting calls saw: {calls} (the connection dropped)")
    print(
        f"  restarted on the same file in {report.restart_s:.1f} s; the members resent "
        "(identical requests)"
    )
    for k, (reward, masked) in enumerate(zip(report.rewards, report.masked, strict=True)):
        note = " (masked)" if masked else ""
        print(f"    member {k}: reward {reward:.3f}{note}  ({_short(RESTART_ANSWERS[k], 50)})")
    resumed = sorted(set(report.resumed))
    same = "=" if report.requests_after_restart == n - j else "≠"
    print(
        f"  judge requests after the restart: {report.requests_after_restart} {same} the "
        f"{n - j} passes not journaled\n  (judge_passes_resumed = "
        f"{', '.join(map(str, resumed))}: the journaled verdicts were taken from the store)"
    )
    replayed = "replayed" if all(report.replayed) else "NOT all replayed"
    print(
        f"  the identical resend after completion: {replayed}, "
        f"{report.requests_on_resend} new judge requests"
    )
