"""Section "vs NeMo Gym genrm_compare": the same groups through NeMo Gym's own server and
through genrm-grpc, in front of one fake judge process (simulated judge).

``python -m bench.gym_peer`` (under the Gym venv; ``make bench-gym``) starts, each as a
process of its own through :mod:`bench.launch`:

* one ``genrm-grpc fake-judge`` (``--latency-ms`` per call, simulated);
* Gym: the ``genrm_compare`` resources server of the installed nemo-gym release and the
  GenRM model server it calls (``GenRMModelMixin`` on ``VLLMModel``, see
  :mod:`bench.gym_servers`), driven over HTTP ``/verify``, one request per rollout, all
  rollouts of a group in flight, as Gym's agents call it;
* ours: one ``genrm-grpc serve``, reached through the ``genrm_grpc_compare`` resources
  server (``/verify`` → ``SubmitMember``) and over gRPC directly (``SubmitMember``, one
  call per member; ``StreamGroups``, one stream per group).

Part 1 (throughput) runs ``--rounds`` interleaved rounds (ABAB: the side order reverses
every round) of ``--groups`` groups of 16 members, ``--in-flight`` groups at a time, the
same texts on every side, and reports per side the median and spread of members/s,
serving-side CPU per member (every serving process, from ``/proc/PID/stat``), judge calls
per member and p50/p99 member latency, and the ratio ours / Gym.

Part 2 (faults) runs one scripted scenario against Gym's ``/verify`` and ours (groups of
16, on the same processes): an identical retry of a member, a replacement attempt while
the old one is still collecting, a member that never arrives, a judge answering 503 and
then 400 to every call for a group's pairs. Each caller waits at most ``--timeout-s``;
the counts come from the replies and from the fake judge's per-pair counters.

Writes ``--out`` (JSON) and prints the Markdown section (``--markdown FILE`` to keep it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
import httpx
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from bench import launch
from bench.loadgen import PROMPT_TEXT, answer_text
from bench.mpreport import write_section
from bench.util import percentile
from genrm_grpc.testing.heuristic import pair_key

SIZE = 16
FAULT_SIZE = SIZE
FAIL_FIRST_N = 50  # more calls of a pair than either side makes: the pair is never answered
SIDES = ("gym", "ours-http", "ours-grpc", "ours-stream")
LABEL = {
    "gym": "Gym genrm_compare `/verify`",
    "ours-http": "ours, `genrm_grpc_compare` `/verify`",
    "ours-grpc": "ours, gRPC `SubmitMember`",
    "ours-stream": "ours, gRPC `StreamGroups`",
}


# ----------------------------------------------------------------------------- texts


def prompt_messages(n: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": f"Question {n}: {PROMPT_TEXT}"},
    ]


def gym_response(text: str, tag: str) -> dict[str, Any]:
    """A Responses-API object as a Gym policy model returns it."""
    return {
        "id": f"resp-{tag}",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": [
            {
                "id": f"msg-{tag}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def verify_payload(
    group: str, task: int, n: int, index: int, text: str, attempt: int = 0
) -> dict[str, Any]:
    """One rollout's ``/verify`` body; both resources servers get the same one (Gym
    0.4.0 keys its cohort by ``_ng_task_index`` + prompt and ignores the group id)."""
    return {
        "responses_create_params": {"input": prompt_messages(n)},
        "response": gym_response(text, f"{group}-{attempt}-{index}"),
        "_ng_task_index": task,
        "_ng_rollout_index": index,
        "_ng_group_id": group,
        "_ng_group_attempt": attempt,
    }


def grpc_members(group: str, n: int, size: int, answer_bytes: int) -> list[pb.SubmitMemberRequest]:
    prompt = pb.Prompt(
        messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in prompt_messages(n)]
    )
    return [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(group_id=group, group_attempt=0, rollout_index=i, group_size=size),
            prompt=prompt,
            candidate=pb.Candidate(output_text=answer_text(n, i, answer_bytes)),
        )
        for i in range(size)
    ]


# ----------------------------------------------------------------------------- stack


@dataclass
class Stack:
    judge: launch.FakeJudge
    gym: list[launch.Proc]  # [model server, genrm_compare]
    ours: list[launch.Proc]  # [genrm-grpc serve, genrm_grpc_compare]

    def serving(self, side: str) -> list[launch.Proc]:
        if side == "gym":
            return self.gym
        if side == "ours-http":
            return self.ours
        return self.ours[:1]

    def url(self, side: str) -> str:
        return f"http://{(self.gym if side == 'gym' else self.ours)[-1].target}"


@contextmanager
def running(logs: pathlib.Path, size: int, latency_ms: float, **serve: Any) -> Iterator[Stack]:
    """Fake judge, Gym's two servers and ours, all on loopback, stopped on exit."""
    with ExitStack() as stack:

        def keep(proc: launch.Proc) -> launch.Proc:
            stack.callback(proc.stop)
            return proc

        tag = f"g{size}"
        judge = launch.FakeJudge(f"{tag}-judge", logs, "--latency-ms", str(latency_ms))
        stack.callback(judge.stop)
        model = keep(
            launch.start_gym(
                f"{tag}-gym-model", "model", logs, "--judge-url", judge.url, "--model", launch.MODEL
            )
        )
        compare = keep(
            launch.start_gym(
                f"{tag}-gym-genrm-compare",
                "genrm_compare",
                logs,
                "--model-port",
                str(model.port),
                "--size",
                str(size),
                "--principle",
                launch.PRINCIPLE,
            )
        )
        ours = start_ours(f"{tag}-ours", judge, logs, size, **serve)
        result = Stack(judge, [model, compare], ours)

        @stack.callback
        def _stop_ours() -> None:  # whichever of ours runs at the end
            for proc in result.ours:
                proc.stop()

        yield result


def start_ours(
    name: str, judge: launch.FakeJudge, logs: pathlib.Path, size: int, **serve: Any
) -> list[launch.Proc]:
    """``genrm-grpc serve`` (the judge requests Gym's model server sends: chat
    completions) and the ``genrm_grpc_compare`` resources server in front of it."""
    service = launch.start_service(
        f"{name}-serve",
        judge,
        logs,
        concurrency=serve.pop("concurrency", 64),
        judge_keys={"api": "chat_completions", "max_output_tokens": 1024},
        num_rollouts_per_prompt=size,
        **serve,
    )
    try:
        adapter = launch.start_gym(
            f"{name}-adapter",
            "genrm_grpc_compare",
            logs,
            "--grpc-target",
            service.target,
            "--size",
            str(size),
        )
    except BaseException:
        service.stop()
        raise
    return [service, adapter]


# ----------------------------------------------------------------------------- part 1


@dataclass
class Round:
    side: str
    members: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0
    caller_cpu_s: float = 0.0
    judge_calls: int = 0
    latencies: list[float] = field(default_factory=list)
    first_error: str | None = None

    def row(self) -> dict[str, Any]:
        m = max(self.members, 1)
        return {
            "side": self.side,
            "members": self.members,
            "errors": self.errors,
            "members_per_s": self.members / self.elapsed_s if self.elapsed_s else math.nan,
            "cpu_ms_per_member": self.cpu_s / m * 1e3,
            "caller_cpu_ms_per_member": self.caller_cpu_s / m * 1e3,
            "judge_calls_per_member": self.judge_calls / m,
            "p50_ms": percentile(self.latencies, 0.5) * 1e3,
            "p99_ms": percentile(self.latencies, 0.99) * 1e3,
            "first_error": self.first_error,
        }


class Driver:
    """The callers (this process): HTTP ``/verify`` and gRPC."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        # aiohttp, the client Gym's own agents call /verify with (nemo_gym.server_utils)
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
        )
        self.channel = grpc.aio.insecure_channel(stack.ours[0].target)
        self.stub = pb_grpc.CohortServiceStub(self.channel)
        self.task = 0

    async def close(self) -> None:
        await self.http.close()
        await self.channel.close()

    async def group(self, side: str, n: int, rnd: Round, answer_bytes: int) -> None:
        perf = time.perf_counter
        group = f"{side}-{uuid.uuid4().hex[:8]}-{n}"

        def fail(exc: BaseException | str) -> None:
            rnd.errors += 1
            rnd.first_error = rnd.first_error or repr(exc)[:300]

        if side in ("gym", "ours-http"):
            self.task += 1
            task = self.task
            url = self.stack.url(side) + "/verify"

            async def one(i: int) -> None:
                body = verify_payload(group, task, n, i, answer_text(n, i, answer_bytes))
                t0 = perf()
                async with self.http.post(url, json=body) as reply:
                    data = await reply.read()
                if reply.status != 200:
                    fail(f"HTTP {reply.status} {data[:200]!r}")
                    return
                rnd.latencies.append(perf() - t0)
                rnd.members += 1

            await asyncio.gather(*(one(i) for i in range(SIZE)))
        elif side == "ours-grpc":
            reqs = grpc_members(group, n, SIZE, answer_bytes)

            async def unary(req: pb.SubmitMemberRequest) -> None:
                t0 = perf()
                try:
                    await self.stub.SubmitMember(req, timeout=300)
                except grpc.RpcError as exc:
                    fail(exc)
                    return
                rnd.latencies.append(perf() - t0)
                rnd.members += 1

            await asyncio.gather(*(unary(r) for r in reqs))
        else:
            reqs = grpc_members(group, n, SIZE, answer_bytes)
            t0 = perf()
            try:
                call = self.stub.StreamGroups(
                    iter([pb.StreamGroupsRequest(member=r) for r in reqs]), timeout=300
                )
                async for event in call:
                    kind = event.WhichOneof("event")
                    if kind == "result":
                        rnd.latencies.append(perf() - t0)
                        rnd.members += 1
                    elif kind == "error":
                        fail(str(event.error))
            except grpc.RpcError as exc:
                fail(exc)

    async def round(
        self, side: str, prefix: int, groups: int, in_flight: int, answer_bytes: int
    ) -> Round:
        rnd = Round(side)
        procs = self.stack.serving(side)
        self.stack.judge.reset()
        cpu0 = sum(p.cpu() for p in procs)
        caller0 = launch.cpu_seconds(os.getpid())
        queue = iter(range(prefix, prefix + groups))
        started = time.perf_counter()

        async def worker() -> None:
            for n in queue:
                await self.group(side, n, rnd, answer_bytes)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        rnd.elapsed_s = time.perf_counter() - started
        rnd.cpu_s = sum(p.cpu() for p in procs) - cpu0
        rnd.caller_cpu_s = launch.cpu_seconds(os.getpid()) - caller0
        rnd.judge_calls = int(self.stack.judge.stats()["total"])
        return rnd


async def throughput(
    stack: Stack, *, rounds: int, groups: int, in_flight: int, answer_bytes: int
) -> dict[str, Any]:
    driver = Driver(stack)
    try:
        for side in SIDES:  # warm-up: connections, imports, first-call paths
            await driver.round(side, 10_000, min(groups, 2), min(in_flight, 2), answer_bytes)
        per_side: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        for r in range(rounds):
            order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                # the same groups (same texts) on every side in round r
                rnd = await driver.round(side, r * groups, groups, in_flight, answer_bytes)
                per_side[side].append(rnd.row())
    finally:
        await driver.close()
    return {"rounds": per_side, "summary": summarize(per_side)}


METRICS = ("members_per_s", "cpu_ms_per_member", "judge_calls_per_member", "p50_ms", "p99_ms")
EXTRA = ("caller_cpu_ms_per_member",)


def summarize(per_side: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side, rows in per_side.items():
        out[side] = {
            m: {
                "median": statistics.median(r[m] for r in rows),
                "min": min(r[m] for r in rows),
                "max": max(r[m] for r in rows),
            }
            for m in METRICS + EXTRA
        }
        out[side]["errors"] = sum(r["errors"] for r in rows)
        out[side]["members"] = sum(r["members"] for r in rows)
    return out


# ----------------------------------------------------------------------------- part 2


@dataclass
class Reply:
    scenario: str
    attempt: int
    index: int
    status: int | None  # None: still waiting at the caller's timeout
    reward: float | None = None
    masked: bool = False


async def fault_scenario(stack: Stack, side: str, timeout_s: float) -> dict[str, Any]:
    """The scripted faults against one side's ``/verify`` (``gym`` or ``ours-http``)."""
    url = stack.url(side) + "/verify"
    base = 900_000 + (0 if side == "gym" else 1000)
    run = uuid.uuid4().hex[:8]
    texts: dict[tuple[str, int, int], str] = {}
    replies: list[Reply] = []

    def text(scenario: str, attempt: int, index: int) -> str:
        key = (scenario, attempt, index)
        if key not in texts:
            texts[key] = f"{scenario} attempt {attempt} member {index}: " + answer_text(
                base + len(texts), index, 160
            )
        return texts[key]

    task_of = {
        "retry": base + 1,
        "replace": base + 2,
        "missing": base + 3,
        "judge503": base + 4,
        "judge400": base + 5,
    }

    async with httpx.AsyncClient(timeout=timeout_s) as http:

        async def send(scenario: str, attempt: int, index: int) -> None:
            task = task_of[scenario]
            body = verify_payload(
                f"faults-{run}-{scenario}",
                task,
                task,
                index,
                text(scenario, attempt, index),
                attempt=attempt,
            )
            try:
                reply = await http.post(url, json=body)
            except httpx.TimeoutException:
                replies.append(Reply(scenario, attempt, index, None))
                return
            data = reply.json()
            ok = reply.status_code == 200
            replies.append(
                Reply(
                    scenario,
                    attempt,
                    index,
                    reply.status_code,
                    data.get("reward") if ok else None,
                    bool(data.get("mask_sample")) if ok else False,
                )
            )

        async def script(steps: Sequence[tuple[str, int, int]]) -> None:
            tasks = []
            for step in steps:  # arrival order as a trainer's retries produce it
                tasks.append(asyncio.create_task(send(*step)))
                await asyncio.sleep(0.05)
            await asyncio.gather(*tasks)

        stack.judge.faults(fail_503_first_n=0, fail_400_first_n=0)
        stack.judge.reset()
        half = FAULT_SIZE // 2
        await asyncio.gather(
            # an identical retry of member 0 (its caller timed out) while the original waits
            script(
                [("retry", 0, 0), ("retry", 0, 1), ("retry", 0, 0)]
                + [("retry", 0, i) for i in range(2, FAULT_SIZE)]
            ),
            # attempt 1 replaces attempt 0, which has half of its members in
            script(
                [("replace", 0, i) for i in range(half)]
                + [("replace", 1, i) for i in range(FAULT_SIZE)]
            ),
            # the last member never arrives
            script([("missing", 0, i) for i in range(FAULT_SIZE - 1)]),
        )
        clean_pairs: dict[str, int] = dict(stack.judge.stats()["pairs"])
        fault_pairs: dict[str, dict[str, int]] = {}
        # the judge answers 503 (overloaded), then 400, to every call for a group's pairs
        for scenario, fault in (("judge503", "fail_503_first_n"), ("judge400", "fail_400_first_n")):
            stack.judge.faults(**{fault: FAIL_FIRST_N})
            stack.judge.reset()
            await script([(scenario, 0, i) for i in range(FAULT_SIZE)])
            fault_pairs[scenario] = dict(stack.judge.stats()["pairs"])
            stack.judge.faults(**{fault: 0})
        stack.judge.reset()

    return count_faults(replies, texts, clean_pairs, fault_pairs)


def count_faults(
    replies: list[Reply],
    texts: dict[tuple[str, int, int], str],
    clean_pairs: dict[str, int],
    fault_pairs: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """The five counts of the table from the callers' replies and the judge's pairs."""
    # every ordered pair key of texts of one scenario → (text a, text b)
    names: dict[str, tuple[tuple[str, int, int], tuple[str, int, int]]] = {}
    for a in texts:
        for b in texts:
            if a[0] == b[0]:
                names[pair_key(texts[a], texts[b])] = (a, b)

    Judged = list[tuple[tuple[str, int, int], tuple[str, int, int], int]]

    def judged(pairs: dict[str, int]) -> Judged:
        return [(*names[k], n) for k, n in pairs.items() if k in names]

    clean = judged(clean_pairs)
    rewarded = [r for r in replies if r.status == 200 and not r.masked]
    mixed = 0
    partial = 0
    for scenario in ("retry", "replace", "missing"):
        got = [r for r in rewarded if r.scenario == scenario]
        if not got:
            continue
        seen = {x for a, b, _ in clean if a[0] == scenario for x in (a, b)}
        if len({a[1] for a in seen}) > 1:
            mixed += len(got)  # rewards computed from a set holding two attempts
        # an attempt of which some members got rewards and others none: its reward set
        # cannot have held all of them
        for attempt in {r.attempt for r in got}:
            members = {r.index for r in replies if r.scenario == scenario and r.attempt == attempt}
            paid = {r.index for r in got if r.attempt == attempt}
            if paid != members:
                partial += 1
    # a judge call beyond one per unordered pair of two different answers
    distinct = {frozenset((a, b)) for a, b, _ in clean if a != b}
    duplicates = sum(n for _, _, n in clean) - len(distinct)
    # an ordinary reward for a group with a pair the judge never answered (every call of
    # it within the judge's first FAIL_FIRST_N failures)
    error_rewards = 0
    for scenario, pairs in fault_pairs.items():
        mine = [n for a, _, n in judged(pairs) if a[0] == scenario]
        if not mine or min(mine) <= FAIL_FIRST_N:
            error_rewards += sum(1 for r in rewarded if r.scenario == scenario)
    return {
        "mixed_attempt_rewards": mixed,
        "partial_groups": partial,
        "judge_errors_as_rewards": error_rewards,
        "duplicate_judge_calls": duplicates,
        "callers_left_waiting": sum(1 for r in replies if r.status is None),
        "http_500": sum(1 for r in replies if r.status == 500),
        "replies": [r.__dict__ for r in replies],
        "judge_pairs_clean": len(clean),
        "judge_calls_fault_phases": {k: sum(v.values()) for k, v in fault_pairs.items()},
    }


# ----------------------------------------------------------------------------- report


def _f(x: float, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


FAULT_ROWS = (
    ("mixed_attempt_rewards", "rewards computed from a set mixing two attempts"),
    ("partial_groups", "groups rewarded from a partial set"),
    ("judge_errors_as_rewards", "judge errors turned into ordinary rewards"),
    ("duplicate_judge_calls", "duplicate judge calls"),
    ("callers_left_waiting", "callers left waiting (no answer at the timeout)"),
)


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    s = result["throughput"]["summary"]
    lines = [
        "## vs NeMo Gym genrm_compare (simulated judge)",
        "",
        f"nemo-gym {cfg['gym_version']} from PyPI (its `resources_servers/genrm_compare`, "
        "unchanged) against genrm-grpc, every side a process of its own in front of one "
        f"fake judge process ({cfg['latency_ms']:g} ms per call, **simulated**), on this "
        f"machine ({cfg['cpus']} CPUs). {cfg['rounds']} interleaved rounds (side order "
        f"reversed every round) of {cfg['groups']} groups × {SIZE} members, "
        f"{cfg['in_flight']} groups in flight, the same prompts and {cfg['answer_bytes']}-"
        "character answers on every side, circular strategy, principle on. Median of the "
        "rounds, [min–max] in brackets. Run by `make bench-gym` "
        "(`python -m bench.gym_peer`).",
        "",
        "| side | members/s | serving CPU ms/member | judge calls/member | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        row = s[side]
        cells = []
        for m, d in zip(METRICS, (0, 2, 2, 0, 0), strict=True):
            v = row[m]
            cells.append(f"{_f(v['median'], d)} [{_f(v['min'], d)}–{_f(v['max'], d)}]")
        lines.append(f"| {LABEL[side]} | " + " | ".join(cells) + " |")
    lines += ["", "Ratio ours / Gym (medians):", ""]
    lines += ["| side | members/s | CPU/member | judge calls/member | p50 | p99 |"]
    lines += ["|---|---|---|---|---|---|"]
    for side in SIDES[1:]:
        cells = []
        for m in METRICS:
            gym = s["gym"][m]["median"]
            cells.append(_f(s[side][m]["median"] / gym, 2) + "×" if gym else "–")
        lines.append(f"| {LABEL[side]} | " + " | ".join(cells) + " |")
    errors = {side: s[side]["errors"] for side in SIDES if s[side]["errors"]}
    lines += [
        "",
        "Serving CPU counts every process that serves: Gym's resources server and its "
        "model server; for ours through `/verify` the `genrm_grpc_compare` server and "
        "`genrm-grpc serve`; for gRPC `genrm-grpc serve` alone. Not counted: the callers "
        "and the fake judge. The callers all run in one process (aiohttp for `/verify`, "
        "as Gym's agents call it; grpc.aio) on the same machine; their CPU per member: "
        + ", ".join(
            f"{LABEL[side]} {_f(s[side]['caller_cpu_ms_per_member']['median'], 2)} ms"
            for side in SIDES
        )
        + ". "
        + (f"Failed members: {errors}." if errors else "No member failed on any side."),
        "",
        "Where the wire formats differ: both judge paths send the pair to the fake judge's "
        "`/v1/chat/completions` as `principle`/`response_1`/`response_2` messages after the "
        "prompt (ours with `judge.api: chat_completions`; Gym through its GenRM model "
        "server, which receives `/v1/responses` from genrm_compare and converts it). The "
        "candidate reaches Gym and our `/verify` as a Responses-API object in JSON, our "
        "gRPC calls as `Candidate.output_text` protobuf. Gym judges a pair when its second "
        "member arrives (just in time); ours after the group is complete "
        "(`judge_schedule: after_collection`), so Gym's judge calls overlap collection.",
        "",
        "### The same faults on both (simulated judge)",
        "",
        f"One scripted scenario through `/verify` on each side, groups of {FAULT_SIZE}, "
        "members sent 50 ms apart: an identical retry of member 0 (its caller gave up) "
        "while the original waits; attempt 1 of a group sent while attempt 0 has half of "
        "its members in; a group whose last member never arrives; then a group judged "
        "while the judge answers 503 to every call for its pairs, and one while it answers "
        f"400 (the first {FAIL_FIRST_N} calls of each pair, more than either side makes). "
        f"Each caller waits at most {cfg['timeout_s']:g} s; ours runs with "
        f"`cohort_collection_timeout_s: {cfg['collection_timeout_s']:g}`. Counts from the "
        "callers' replies and the fake judge's per-pair counters (duplicates: the three "
        "fault-free groups, calls beyond one per pair of two different answers).",
        "",
        f"| count | Gym {cfg['gym_version']} genrm_compare | ours (`genrm_grpc_compare`) |",
        "|---|---|---|",
    ]
    faults = result["faults"]
    for key, text in FAULT_ROWS:
        lines.append(f"| {text} | {faults['gym'][key]} | {faults['ours-http'][key]} |")
    lines += [
        "",
        f"Besides, Gym answered {faults['gym']['http_500']} callers with HTTP 500 (its "
        "buffer for a prompt grew past the group size: an `assert` in `verify`); ours "
        f"{faults['ours-http']['http_500']}. Ours answers the superseded attempt and the "
        "group that never completes with errors (HTTP 409/503 from the `/verify` adapter) "
        "and the group whose judge calls all failed with masked results "
        "(`mask_sample: true`), never a score. Gym's model server retries a 503 every "
        "0.5 s without limit (`RATE_LIMIT_ERROR_CODES` in `nemo_gym.openai_utils`), so "
        "during an outage its callers wait; a 400 (or a 500 after its retries, or an "
        "unparseable verdict) becomes genrm_compare's default scores, returned as a reward.",
        "",
        f"**Honesty.** nemo-gym {cfg['gym_version']} is the release on PyPI, and this is "
        "what it does; NeMo Gym's main branch has moved on since (the cohort-lifecycle "
        "work: group ids and attempts, fencing of superseded attempts, masking of judge "
        "failures), so these counts are not its current behaviour. Gym's `GenRMModel` "
        "starts vLLM itself (a model download and a GPU); here its GenRM message logic "
        "(`GenRMModelMixin`) runs on Gym's `VLLMModel`, which calls an already running "
        "server: the fake judge. All times and rates are from the fake judge (simulated), "
        "not a GPU.",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main

KEPT = "vs-nemo-gym"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import importlib.metadata

    logs = pathlib.Path(args.logs or tempfile.mkdtemp(prefix="bench-gym-"))
    logs.mkdir(parents=True, exist_ok=True)
    config = {
        "gym_version": importlib.metadata.version("nemo-gym"),
        "rounds": args.rounds,
        "groups": args.groups,
        "in_flight": args.in_flight,
        "answer_bytes": args.answer_bytes,
        "latency_ms": args.latency_ms,
        "timeout_s": args.timeout_s,
        "collection_timeout_s": args.collection_timeout_s,
        "cpus": os.cpu_count(),
    }
    result: dict[str, Any] = {"config": config}
    with running(logs, SIZE, args.latency_ms) as stack:
        result["throughput"] = asyncio.run(
            throughput(
                stack,
                rounds=args.rounds,
                groups=args.groups,
                in_flight=args.in_flight,
                answer_bytes=args.answer_bytes,
            )
        )
        # ours again with a short collection deadline (the throughput rounds keep the
        # default: a member may arrive late there); Gym's servers are the same processes
        for proc in stack.ours:
            proc.stop()
        stack.ours = start_ours(
            "g16-ours-faults",
            stack.judge,
            logs,
            SIZE,
            cohort_collection_timeout_s=args.collection_timeout_s,
        )
        result["faults"] = {
            side: asyncio.run(fault_scenario(stack, side, args.timeout_s))
            for side in ("gym", "ours-http")
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gym_peer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--groups", type=int, default=24, help="groups per side and round")
    parser.add_argument("--in-flight", type=int, default=8, help="groups in flight")
    parser.add_argument("--answer-bytes", type=int, default=1024)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="fake judge, simulated")
    parser.add_argument("--timeout-s", type=float, default=8.0, help="a fault caller's wait")
    parser.add_argument("--collection-timeout-s", type=float, default=3.0)
    parser.add_argument("--logs", help="directory for process logs (default: a temp dir)")
    parser.add_argument("--out", default="bench-gym.json")
    parser.add_argument("--markdown", help="also write the Markdown section here")
    parser.add_argument(
        "--docs", type=pathlib.Path, help="write the section into this page (performance.md)"
    )
    args = parser.parse_args(argv)
    result = run(args)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    text = markdown(result)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)
    if args.docs:
        page = pathlib.Path(args.docs)
        page.write_text(write_section(page.read_text() if page.exists() else "", KEPT, text))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
