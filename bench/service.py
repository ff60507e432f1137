"""In-process service benchmarks over real gRPC on loopback (client and server in one
process; for throughput against baselines see the multi-process ``bench/multiproc.py``).

- ``storm``   — judge-call economy when every member is sent three times, with client
                cancellations and reconnects (fresh channels closed mid-call).
- ``eager``   — ``judge_schedule`` eager vs after_collection with staggered member
                arrivals and the fake judge over HTTP (lognormal latency, bounded
                concurrency): time from the last member's arrival to all rewards.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb

from bench.util import median, percentile, ratio
from genrm_grpc.config import Settings, load_settings
from genrm_grpc.judge.client import JudgeInput, JudgeOutcome
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

SERVICE = "genrm.cohort.v1.CohortService"
#: Nothing listens here: the instant judge replaces the HTTP judge client.
NO_JUDGE_URL = "http://127.0.0.1:9"
FIXED_VERDICT = Verdict(score_1=4.0, score_2=3.0, ranking=3.0)


# ----------------------------------------------------------------------------- judges
class InstantJudge:
    """A JudgeBackend answering a fixed verdict at once (or after ``delay()`` seconds)."""

    def __init__(self, delay: Callable[[], float] | None = None) -> None:
        self.calls = 0
        self._delay = delay

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        self.calls += 1
        if self._delay is not None:
            await asyncio.sleep(self._delay())
        verdict = FIXED_VERDICT.swapped() if swap else FIXED_VERDICT
        return JudgeOutcome(verdict=verdict, usage=None, attempts=1)


# ----------------------------------------------------------------------------- requests
def answer_text(n: int, i: int, size: int) -> str:
    """A distinct answer of exactly ``size`` characters (ASCII, so also bytes)."""
    head = f"group {n} member {i}: "
    words = (
        "the answer considers each step carefully and explains why the result holds "
        "for every case that the question mentions, with a short example "
    )
    body = (head + words * (size // len(words) + 2))[:size]
    return body


def group_requests(
    prefix: str, n: int, size: int, answer_bytes: int, attempt: int = 0
) -> list[pb.SubmitMemberRequest]:
    prompt = pb.Prompt(
        messages=[
            pb.ChatMessage(role="system", content="You are a careful assistant."),
            pb.ChatMessage(role="user", content=f"Question {n}: explain the reasoning step."),
        ]
    )
    return [
        pb.SubmitMemberRequest(
            member=pb.MemberRef(
                group_id=f"{prefix}-{n}",
                group_attempt=attempt,
                rollout_index=i,
                group_size=size,
            ),
            prompt=prompt,
            candidate=pb.Candidate(output_text=answer_text(n, i, answer_bytes)),
        )
        for i in range(size)
    ]


def check_result(result: pb.MemberResult) -> None:
    if result.mask_sample or not math.isfinite(result.reward):
        raise RuntimeError(f"unexpected result {result}")


# ----------------------------------------------------------------------------- servers
#: Concurrent HTTP/2 streams per connection allowed on both servers: above the most
#: calls a benchmark keeps in flight on one channel (48 groups x 16 members).
MAX_STREAMS = 4096


def stream_limit() -> dict[str, Any]:
    """The server's stream cap raised to MAX_STREAMS (if this version has the setting)."""
    if "max_concurrent_streams" in Settings.model_fields:
        return {"max_concurrent_streams": MAX_STREAMS}
    return {}


async def start_service(
    judge: Any,
    *,
    group_size: int,
    judge_url: str = NO_JUDGE_URL,
    **overrides: Any,
) -> CohortServer:
    """The one in-process server of the benchmarks: a CohortServer on 127.0.0.1:0, groups
    of ``group_size``, circular; ``judge`` (if not None) replaces the HTTP judge."""
    settings = load_settings(
        listen="127.0.0.1:0",
        judge={"url": judge_url},
        **stream_limit(),
        num_rollouts_per_prompt=group_size,
        comparison_strategy="circular",
        genrm_parse_retry_sleep_s=0.01,
        shutdown_grace_s=1.0,
        # In-process micro-benchmarks of the service's own work: no store file (the
        # default would be genrm-state.sqlite3 in the working directory, replaying the
        # previous run's groups). The store's cost is the multi-process `store` section.
        **{"store": "memory://", **overrides},
    )
    server = CohortServer(settings, judge_backend=judge)
    await server.start()
    return server


class Side:
    """One target: a channel and the two multicallables."""

    def __init__(self, name: str, port: int, service: str) -> None:
        self.name = name
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.unary = self.channel.unary_unary(
            f"/{service}/SubmitMember",
            request_serializer=pb.SubmitMemberRequest.SerializeToString,
            response_deserializer=pb.SubmitMemberResponse.FromString,
        )
        self.stream = self.channel.stream_stream(
            f"/{service}/StreamGroups",
            request_serializer=pb.StreamGroupsRequest.SerializeToString,
            response_deserializer=pb.StreamGroupsResponse.FromString,
        )

    async def close(self) -> None:
        await self.channel.close(None)


# ----------------------------------------------------------------------------- storm
@dataclass(slots=True)
class StormPlan:
    groups: int = 96
    group_size: int = 16
    in_flight: int = 16
    answer_bytes: int = 1024
    sends: int = 3
    #: Each of the first (sends - 1) sends of a member is cancelled by the client with
    #: this probability, or sent on a fresh channel that is closed mid-call (a dropped
    #: connection) with ``p_reconnect``; the last send always runs to completion (half of
    #: the time on a fresh channel).
    p_cancel: float = 0.35
    p_reconnect: float = 0.25
    #: Sends start at a random offset in [0, spread_s]; cancellations come after a random
    #: delay in [0, spread_s / 2].
    spread_s: float = 0.08
    judge_delay_ms: tuple[float, float] = (2.0, 20.0)
    seed: int = 0


@dataclass(slots=True)
class StormResult:
    plan: dict[str, Any]
    groups: int
    members: int
    sends: int
    completed: int
    replayed: int
    cancelled_by_client: int
    dropped_connections: int
    other_errors: dict[str, int]
    fresh_channels: int
    judge_calls: int
    judge_calls_ideal: int
    ratio: float
    inconsistent_members: int
    elapsed_s: float
    store_counts: dict[str, int]


async def bench_storm(plan: StormPlan) -> StormResult:
    rng = random.Random(plan.seed)
    low, high = plan.judge_delay_ms
    judge = InstantJudge(delay=lambda: rng.uniform(low, high) / 1e3)
    server = await start_service(judge, group_size=plan.group_size)
    shared = Side("service", server.port, SERVICE)
    counts = {"completed": 0, "replayed": 0, "cancelled": 0, "dropped": 0, "fresh": 0}
    errors: dict[str, int] = {}
    rewards: dict[tuple[str, int], set[float]] = {}

    async def send(req: pb.SubmitMemberRequest, mode: str, *, final: bool) -> None:
        await asyncio.sleep(rng.uniform(0, plan.spread_s))
        side = shared
        if mode in ("reconnect", "fresh"):
            counts["fresh"] += 1
            side = Side("fresh", server.port, SERVICE)
        try:
            task = asyncio.ensure_future(side.unary(req, timeout=60.0))
            if mode == "cancel":
                await asyncio.sleep(rng.uniform(0, plan.spread_s / 2))
                task.cancel()
            elif mode == "reconnect":
                await asyncio.sleep(rng.uniform(0, plan.spread_s / 2))
                await side.channel.close(None)  # drops the connection under the call
            try:
                resp: pb.SubmitMemberResponse = await task
            except asyncio.CancelledError:
                if final or mode not in ("cancel", "reconnect"):
                    raise
                counts["cancelled" if mode == "cancel" else "dropped"] += 1
                return
            except grpc.aio.AioRpcError as exc:
                if mode == "reconnect" and not final:
                    counts["dropped"] += 1
                    return
                name = exc.code().name
                errors[name] = errors.get(name, 0) + 1
                return
            check_result(resp.result)
            counts["completed"] += 1
            counts["replayed"] += resp.result.replayed
            key = (req.member.group_id, req.member.rollout_index)
            rewards.setdefault(key, set()).add(resp.result.reward)
        finally:
            if side is not shared:
                await side.close()

    async def member(req: pb.SubmitMemberRequest) -> None:
        plans: list[tuple[str, bool]] = []
        for _ in range(plan.sends - 1):
            u = rng.random()
            mode = (
                "cancel"
                if u < plan.p_cancel
                else "reconnect"
                if u < plan.p_cancel + plan.p_reconnect
                else "plain"
            )
            plans.append((mode, False))
        plans.append(("fresh" if rng.random() < 0.5 else "plain", True))
        await asyncio.gather(*(send(req, mode, final=final) for mode, final in plans))

    gate = asyncio.Semaphore(plan.in_flight)

    async def group(n: int) -> None:
        async with gate:
            reqs = group_requests("storm", n, plan.group_size, plan.answer_bytes)
            await asyncio.gather(*(member(r) for r in reqs))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(group(n) for n in range(plan.groups)))
        elapsed = time.perf_counter() - t0
        census = await server.runtime.refresh_census()
        store_counts = {
            "active_cohorts": census.collecting + census.evaluating,
            "tombstones": census.tombstones,
            "watermarks": census.watermarks,
        }
        runtime_calls = server.runtime.judge_calls
    finally:
        await shared.close()
        await server.stop()
    if runtime_calls != judge.calls:
        raise RuntimeError(f"runtime counted {runtime_calls} judge calls, judge {judge.calls}")
    members = plan.groups * plan.group_size
    ideal = plan.groups * plan.group_size  # circular: one pair per member
    missing = members - len(rewards)
    if missing:
        raise RuntimeError(f"{missing} members got no result")
    return StormResult(
        plan={
            "groups": plan.groups,
            "group_size": plan.group_size,
            "in_flight": plan.in_flight,
            "sends": plan.sends,
            "p_cancel": plan.p_cancel,
            "p_reconnect": plan.p_reconnect,
            "spread_s": plan.spread_s,
            "judge_delay_ms": list(plan.judge_delay_ms),
        },
        groups=plan.groups,
        members=members,
        sends=members * plan.sends,
        completed=counts["completed"],
        replayed=counts["replayed"],
        cancelled_by_client=counts["cancelled"],
        dropped_connections=counts["dropped"],
        other_errors=errors,
        fresh_channels=counts["fresh"],
        judge_calls=judge.calls,
        judge_calls_ideal=ideal,
        ratio=ratio(judge.calls, ideal),
        inconsistent_members=sum(1 for v in rewards.values() if len(v) != 1),
        elapsed_s=elapsed,
        store_counts=store_counts,
    )


# ----------------------------------------------------------------------------- eager
@dataclass(slots=True)
class EagerPlan:
    groups: int = 24
    group_size: int = 16
    rounds: int = 3
    answer_bytes: int = 1024
    #: Group g starts at a uniform offset in [0, start_spread_s]; its members arrive after
    #: lognormal delays (median, sigma) as generation lengths vary, capped at max_delay_s.
    start_spread_s: float = 1.5
    arrival_median_s: float = 0.5
    arrival_sigma: float = 0.6
    max_delay_s: float = 3.0
    judge_latency_ms: str = "lognormal:80:0.5"
    judge_max_concurrency: int = 16
    seed: int = 0


@dataclass(slots=True)
class EagerRun:
    schedule: str
    round: int
    #: Per group: last member's arrival → all its rewards (s).
    post_s: list[float]
    #: Per group: first member's arrival → all its rewards (s).
    total_s: list[float]
    judge_requests: int
    elapsed_s: float


def arrival_schedule(plan: EagerPlan, rng: random.Random) -> list[tuple[float, list[float]]]:
    out = []
    for _ in range(plan.groups):
        start = rng.uniform(0, plan.start_spread_s)
        delays = [
            min(
                plan.max_delay_s, plan.arrival_median_s * math.exp(plan.arrival_sigma * rng.gauss())
            )
            for _ in range(plan.group_size)
        ]
        out.append((start, delays))
    return out


async def eager_once(
    plan: EagerPlan,
    judge: FakeJudgeServer,
    schedule: str,
    arrivals: list[tuple[float, list[float]]],
    round_: int,
) -> EagerRun:
    server = await start_service(
        None,
        group_size=plan.group_size,
        judge_url=judge.url,
        judge_schedule=schedule,
        judge_max_concurrency=plan.judge_max_concurrency,
    )
    side = Side("service", server.port, SERVICE)
    try:
        # Open the channel and the judge connections first.
        warm = group_requests(f"warm-{schedule}-{round_}", 0, plan.group_size, plan.answer_bytes)
        await asyncio.gather(*(side.unary(r, timeout=60.0) for r in warm))
        judge.reset_stats()
        t0 = time.perf_counter()
        post: list[float] = []
        total: list[float] = []

        async def group(n: int, start: float, delays: list[float]) -> None:
            reqs = group_requests(
                f"sched-{schedule}-{round_}", n, plan.group_size, plan.answer_bytes
            )
            sent: list[float] = []

            async def member(req: pb.SubmitMemberRequest, delay: float) -> None:
                await asyncio.sleep(max(0.0, t0 + start + delay - time.perf_counter()))
                sent.append(time.perf_counter())
                resp = await side.unary(req, timeout=120.0)
                check_result(resp.result)

            await asyncio.gather(*(member(r, d) for r, d in zip(reqs, delays, strict=True)))
            done = time.perf_counter()
            post.append(done - max(sent))
            total.append(done - min(sent))

        await asyncio.gather(*(group(n, s, d) for n, (s, d) in enumerate(arrivals)))
        elapsed = time.perf_counter() - t0
        judged = int(judge.stats()["total"])
    finally:
        await side.close()
        await server.stop()
    return EagerRun(schedule, round_, post, total, judged, elapsed)


@dataclass(slots=True)
class EagerResult:
    plan: dict[str, Any]
    runs: list[dict[str, Any]]
    #: schedule → median over rounds of the per-round median post-collection time (ms).
    post_median_ms: dict[str, float]
    post_p90_ms: dict[str, float]
    total_median_ms: dict[str, float]
    #: Median over rounds of (eager median ÷ after_collection median) in that round.
    ratio: float
    ratio_rounds: list[float]
    judge_requests_per_group: dict[str, float]
    post_ms: dict[str, list[float]]


async def bench_eager(plan: EagerPlan) -> EagerResult:
    rng = random.Random(plan.seed)
    runs: list[EagerRun] = []
    config = FakeJudgeConfig(latency_ms=plan.judge_latency_ms, seed=plan.seed)
    with FakeJudgeServer(config) as judge:
        for round_ in range(plan.rounds):
            arrivals = arrival_schedule(plan, rng)  # the same arrivals for both schedules
            order = ("eager", "after_collection")
            if round_ % 2:
                order = order[::-1]
            for schedule in order:
                runs.append(await eager_once(plan, judge, schedule, arrivals, round_))
    post_med: dict[str, float] = {}
    post_p90: dict[str, float] = {}
    total_med: dict[str, float] = {}
    per_group: dict[str, float] = {}
    pooled: dict[str, list[float]] = {}
    for schedule in ("eager", "after_collection"):
        mine = [r for r in runs if r.schedule == schedule]
        post_med[schedule] = median([statistics.median(r.post_s) * 1e3 for r in mine])
        post_p90[schedule] = median([percentile(r.post_s, 0.9) * 1e3 for r in mine])
        total_med[schedule] = median([statistics.median(r.total_s) * 1e3 for r in mine])
        per_group[schedule] = sum(r.judge_requests for r in mine) / (plan.groups * len(mine))
        pooled[schedule] = [t * 1e3 for r in mine for t in r.post_s]
    ratios = []
    for round_ in range(plan.rounds):
        e = next(r for r in runs if r.round == round_ and r.schedule == "eager")
        a = next(r for r in runs if r.round == round_ and r.schedule == "after_collection")
        ratios.append(ratio(statistics.median(e.post_s), statistics.median(a.post_s)))
    return EagerResult(
        plan={
            "groups": plan.groups,
            "group_size": plan.group_size,
            "rounds": plan.rounds,
            "start_spread_s": plan.start_spread_s,
            "arrival_median_s": plan.arrival_median_s,
            "arrival_sigma": plan.arrival_sigma,
            "max_delay_s": plan.max_delay_s,
            "judge_latency_ms": plan.judge_latency_ms,
            "judge_max_concurrency": plan.judge_max_concurrency,
        },
        runs=[
            {
                "schedule": r.schedule,
                "round": r.round,
                "post_median_ms": statistics.median(r.post_s) * 1e3,
                "post_p90_ms": percentile(r.post_s, 0.9) * 1e3,
                "total_median_ms": statistics.median(r.total_s) * 1e3,
                "judge_requests": r.judge_requests,
                "elapsed_s": r.elapsed_s,
            }
            for r in runs
        ],
        post_median_ms=post_med,
        post_p90_ms=post_p90,
        total_median_ms=total_med,
        ratio=median(ratios),
        ratio_rounds=ratios,
        judge_requests_per_group=per_group,
        post_ms=pooled,
    )
