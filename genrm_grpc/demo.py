"""``genrm-grpc demo`` (``make demo``): the whole job end to end on loopback.

Starts the fake judge (a deterministic test double, not a model) and the server as
subprocesses on free ports, then, over real gRPC with the generated client:

1. ``Compare``: each example prompt of NeMo Gym's genrm_compare data with four answers
   of different quality, printed as a reward table;
2. ``StreamGroups``: one whole group attempt pushed on a stream, with acceptances,
   judging progress and rewards printed as they arrive;
3. ``genrm-grpc collect`` (a subprocess) over ``data/demo_rollouts.jsonl``, a small Gym
   rollout file built from the example prompts, printing the rewards table and the
   metrics summary of its outputs;
4. a restart that loses nothing (:func:`restart_act`): a group is submitted to a server
   in front of a slow fake judge, the server is SIGKILLed once the store file holds
   some journaled verdicts, started again on the same file, and the members are resent:
   only the passes the journal lacked are judged; an identical resend after completion
   costs no judge call at all;

and stops everything. Every server of the demo keeps its store in a temporary
directory, never in the working directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from genrm_cohort_client import CohortClient, status_error_info

# Four answers per prompt, best first by intent: a complete answer, a terse one, an
# off-topic one, and an empty one (judged as the literal "None").
ANSWERS: dict[int, list[str]] = {
    0: [
        'The right option is "conflict": to conflict means to fit so poorly together that '
        "the differences cause a problem, as when two meeting times conflict. Symbolic, "
        "hedonistic and phonetic describe symbols, pleasure-seeking and speech sounds.",
        "conflict",
        "The answer is phonetic, because the words sound different when spoken.",
        "",
    ],
    1: [
        '"SKILL" usually means the ability to do something well, gained through training '
        "and practice. Written in capitals it can also be SKILL, the Lisp-based scripting "
        "language of Cadence electronic design tools, used to automate chip layout tasks.",
        "A skill is something you are good at.",
        "SKILL is a brand of kitchen appliances.",
        "",
    ],
    2: [
        "Externalities are effects of an activity on third parties that prices do not "
        "capture. A positive externality, such as vaccination or a company training "
        "workers who later move on, benefits others, so markets under-supply it. A negative "
        "externality, such as factory pollution or traffic congestion, harms others, so "
        "markets over-supply it. Governments mitigate negative externalities with "
        "Pigouvian taxes (carbon taxes), tradable permits (emissions trading schemes), "
        "direct regulation and standards (emission limits), and liability rules, and "
        "sustainable organisations respond by pricing their own externalities internally.",
        "Positive externalities help others and negative ones harm others; governments "
        "use taxes and rules against the negative ones.",
        "Sustainable organisations should recycle more and use less paper.",
        "",
    ],
    3: [
        "Reinforcement learning is a way for an agent to learn which actions to take by "
        "trying them in an environment and adjusting its behaviour to maximise reward.",
        "Learning from rewards.",
        "Reinforcement learning is when you repeat a lesson until you remember it.",
        "",
    ],
    4: [
        "Unit testing catches bugs early, close to the code that causes them, and it makes "
        "refactoring safer because the tests show that behaviour did not change.",
        "Fewer bugs and safer changes.",
        "Unit tests make the program run faster.",
        "",
    ],
}


def load_prompts() -> list[list[tuple[str, str]]]:
    data = resources.files("genrm_grpc.data").joinpath("gym_genrm_example_prompts.jsonl")
    prompts = []
    for line in data.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            turns = row["responses_create_params"]["input"]
            prompts.append([(t["role"], t["content"]) for t in turns])
    return prompts


def to_prompt(turns: list[tuple[str, str]]) -> pb.Prompt:
    return pb.Prompt(messages=[pb.ChatMessage(role=r, content=c) for r, c in turns])


@contextlib.contextmanager
def _process(
    args: list[str], ready_prefix: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start a subprocess and wait for its one-line readiness announcement."""
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith(ready_prefix):
            raise RuntimeError(f"{args[3]} did not start (said {line!r})")
        yield proc, line[len(ready_prefix) :].strip()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def running_stack(
    extra_server_args: list[str] | None = None, *, store: str | None = None
) -> Iterator[tuple[str, str]]:
    """Fake judge + server on free loopback ports; yields (judge_url, grpc_target).

    ``store`` is the server's ``store`` URL (``GENRM_STORE``); by default the server's
    own default applies (or ``GENRM_STORE`` of the caller's environment)."""
    py = [sys.executable, "-m", "genrm_grpc.cli"]
    with _process([*py, "fake-judge", "--port", "0"], "fake-judge listening on") as (_, url):
        server_args = [
            *py,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--judge-url",
            url,
            "--num-rollouts-per-prompt",
            "4",
            "--genrm-parse-retry-sleep-s",
            "0.05",
            "--log-level",
            "WARNING",
            *(extra_server_args or []),
        ]
        env = {"GENRM_STORE": store} if store is not None else None
        with _process(server_args, "genrm-grpc serving on", env) as (_, target):
            yield url, target


def _short(text: str, width: int) -> str:
    flat = " ".join(text.split()) or "(empty → judged as None)"
    return flat if len(flat) <= width else flat[: width - 1] + "…"


async def _compare_table(client: CohortClient, prompts: list[list[tuple[str, str]]]) -> None:
    print("\n== Compare: one reward per candidate, relative to its siblings ==")
    for n, turns in enumerate(prompts):
        answers = ANSWERS[n % len(ANSWERS)]
        reply = await client.compare(
            to_prompt(turns), [pb.Candidate(output_text=a) for a in answers], timeout=60
        )
        print(f"\nprompt {n}: {_short(turns[-1][1], 70)}")
        print(f"  {'#':>2}  {'reward':>7}  answer")
        for k, (answer, reward) in enumerate(zip(answers, reply.rewards, strict=True)):
            print(f"  {k:>2}  {reward:7.3f}  {_short(answer, 60)}")
        tie_rate = reply.metrics.get("tiebreak_usage_rate", 0.0)
        print(f"      {len(reply.comparisons)} comparisons, tiebreak_usage_rate={tie_rate:.2f}")


async def _stream_group(client: CohortClient, turns: list[tuple[str, str]]) -> None:
    print("\n== StreamGroups: one group attempt, rewards published together ==")
    answers = ANSWERS[3]
    prompt = to_prompt(turns)

    async def members() -> AsyncIterator[pb.SubmitMemberRequest]:
        for k, answer in enumerate(answers):
            yield pb.SubmitMemberRequest(
                member=pb.MemberRef(
                    group_id="demo-group", group_attempt=0, rollout_index=k, group_size=4
                ),
                prompt=prompt,
                candidate=pb.Candidate(output_text=answer),
            )

    async for event in client.stream_groups(members(), timeout=60):
        kind = event.WhichOneof("event")
        if kind == "accepted":
            print(f"  accepted     member {event.accepted.member.rollout_index}")
        elif kind == "pair_judged":
            p = event.pair_judged
            print(f"  pair judged  ({p.response_i}, {p.response_j}) judge {p.judge_index}")
        elif kind == "result":
            r = event.result
            print(
                f"  reward       member {r.member.rollout_index}: {r.reward:.3f}  "
                f"({_short(answers[r.member.rollout_index], 50)})"
            )
        else:
            err = status_error_info(event.error.status)
            print(f"  error        member {event.error.member.rollout_index}: {err.reason}")
    info = await client.get_cohort(pb.MemberRef(group_id="demo-group", group_attempt=0))
    print(f"  GetCohort    {info.key}: {pb.CohortPhase.Name(info.phase)}")


async def _run(target: str) -> None:
    prompts = load_prompts()
    async with CohortClient(target) as client:
        await _compare_table(client, prompts)
        await _stream_group(client, prompts[3])


def _collect(target: str) -> None:
    print("\n== genrm-grpc collect: a Gym rollout file scored end to end ==")
    source = resources.files("genrm_grpc.data").joinpath("demo_rollouts.jsonl")
    with tempfile.TemporaryDirectory() as tmp, resources.as_file(source) as rollouts:
        out = Path(tmp) / "results.jsonl"
        command = [sys.executable, "-m", "genrm_grpc.cli", "collect", "--server", target]
        command += ["--input", str(rollouts), "--output", str(out), "--concurrency", "4"]
        print("$ genrm-grpc collect --server", target, "--input demo_rollouts.jsonl", end="")
        print(" --output results.jsonl --concurrency 4")
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        for line in done.stderr.splitlines()[-2:]:
            print(f"  {line}")
        if done.returncode != 0:
            raise RuntimeError(f"genrm-grpc collect exited with {done.returncode}")
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        metrics = json.loads(out.with_name("results.metrics.json").read_text())
    print(f"\n  {'task':>4}  {'#':>2}  {'reward':>7}  answer")
    for row in sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"])):
        answer = "".join(
            part.get("text", "")
            for item in row["response"]["output"]
            if item.get("type") == "message"
            for part in item.get("content", [])
        )
        print(
            f"  {row['_ng_task_index']:>4}  {row['_ng_rollout_index']:>2}  "
            f"{row['reward']:7.3f}  {_short(answer, 56)}"
        )
    reward = metrics["reward"]
    print(
        f"\n  metrics: {metrics['usable_rewards']} usable rewards, mean {reward['mean']:.3f}, "
        f"std {reward['std']:.3f}, min {reward['min']:.3f}, max {reward['max']:.3f}; "
        f"masked rate {metrics['masked_rate']:.2f}; failures "
        f"{metrics['failure_rows_by_class'] or 'none'}; "
        f"{metrics['judge_comparisons']} judge comparisons"
    )


# ----------------------------------------------------------------------------- act 4
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
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
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


def _print_restart(report: RestartReport, judge_latency_ms: int) -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc demo",
        description="Start the fake judge (a test double, not a model) and the server on "
        "free loopback ports, score the example prompts with Compare, push one group "
        "through StreamGroups, score a small rollout file with genrm-grpc collect, kill "
        "a server mid-evaluation and restart it on the same store file, and stop "
        "everything.",
    )
    parser.parse_args(argv)
    print("starting the fake judge (a deterministic test double, not a model) and the server…")
    with tempfile.TemporaryDirectory(prefix="genrm-demo-") as tmp:
        store = f"sqlite:///{Path(tmp).resolve() / 'genrm-state.sqlite3'}"
        with running_stack(store=store) as (url, target):
            print(f"fake judge at {url}, genrm-grpc at {target}")
            print(f"store: {store} (a temporary directory, removed at the end)")
            asyncio.run(_run(target))
            _collect(target)
        latency = 400
        _print_restart(restart_act(Path(tmp), latency), latency)
    print("\nstopped the servers and the fake judges.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
