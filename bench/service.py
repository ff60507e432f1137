"""Service-level benchmarks over real gRPC on loopback (client and server in one process).

- ``echo``    — SubmitMember and StreamGroups against the service with an instant
                in-process judge, alternating with a bare grpc.aio echo servicer that
                receives the same requests and answers with byte-identical responses.
- ``sweep``   — the same pair of servers at 1 … 64 groups in flight (throughput curve).
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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb

from bench.util import median, percentile, ratio
from genrm_grpc.config import Settings, load_settings
from genrm_grpc.judge.client import JudgeInput, JudgeOutcome
from genrm_grpc.judge.fake import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.server.app import CohortServer

SERVICE = "genrm.cohort.v1.CohortService"
ECHO = "bench.v1.Echo"
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
    """A CohortServer on 127.0.0.1:0; ``judge`` (if not None) replaces the HTTP judge."""
    settings = load_settings(
        listen="127.0.0.1:0",
        judge={"url": judge_url},
        **stream_limit(),
        num_rollouts_per_prompt=group_size,
        comparison_strategy="circular",
        genrm_parse_retry_sleep_s=0.01,
        shutdown_grace_s=1.0,
        **overrides,
    )
    server = CohortServer(settings)
    if judge is not None:
        server.runtime._judge = judge
    await server.start()
    return server


@dataclass(slots=True)
class EchoScript:
    """Serialized responses the real service sent, replayed by the echo servicer."""

    #: rollout_index → serialized SubmitMemberResponse.
    unary: dict[int, bytes] = field(default_factory=dict)
    #: rollout_index → serialized "accepted" event.
    accepted: dict[int, bytes] = field(default_factory=dict)
    #: Every other StreamGroups event of one group, in the order the service sent them.
    rest: list[bytes] = field(default_factory=list)

    def sizes(self) -> dict[str, int]:
        return {
            "unary_response_bytes": sum(len(b) for b in self.unary.values()),
            "stream_event_bytes": sum(len(b) for b in self.accepted.values())
            + sum(len(b) for b in self.rest),
            "stream_events": len(self.accepted) + len(self.rest),
        }


def echo_handler(script: EchoScript) -> Any:
    """A bare generic handler: parses each request, answers with canned bytes."""

    async def submit(request: pb.SubmitMemberRequest, context: Any) -> bytes:
        return script.unary[request.member.rollout_index]

    async def stream(
        requests: AsyncIterator[pb.StreamGroupsRequest], context: Any
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            yield script.accepted[request.member.member.rollout_index]
        for event in script.rest:
            yield event

    return grpc.method_handlers_generic_handler(
        ECHO,
        {
            "SubmitMember": grpc.unary_unary_rpc_method_handler(
                submit, request_deserializer=pb.SubmitMemberRequest.FromString
            ),
            "StreamGroups": grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=pb.StreamGroupsRequest.FromString
            ),
        },
    )


async def start_echo(script: EchoScript) -> tuple[Any, int]:
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", MAX_STREAMS)])
    server.add_generic_rpc_handlers((echo_handler(script),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


class Side:
    """One target (service or echo): a channel and the two multicallables."""

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


# ----------------------------------------------------------------------------- drivers
@dataclass(slots=True)
class Drive:
    """One timed run of one API against one side."""

    side: str
    api: str
    in_flight: int
    groups: int
    members: int
    elapsed_s: float
    cpu_s: float
    #: SubmitMember: one per call; StreamGroups: one per member (stream open → its result).
    member_latencies: list[float]
    #: First request sent → last result of the group.
    group_latencies: list[float]

    @property
    def members_per_s(self) -> float:
        return self.members / self.elapsed_s

    def summary(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "api": self.api,
            "in_flight": self.in_flight,
            "groups": self.groups,
            "members": self.members,
            "elapsed_s": self.elapsed_s,
            "cpu_s": self.cpu_s,
            "members_per_s": self.members_per_s,
            "member_p50_ms": percentile(self.member_latencies, 0.5) * 1e3,
            "member_p99_ms": percentile(self.member_latencies, 0.99) * 1e3,
            "group_p50_ms": percentile(self.group_latencies, 0.5) * 1e3,
            "group_p99_ms": percentile(self.group_latencies, 0.99) * 1e3,
        }


async def unary_group(
    side: Side, reqs: Sequence[pb.SubmitMemberRequest], lat: list[float], check: bool
) -> None:
    perf = time.perf_counter

    async def one(req: pb.SubmitMemberRequest) -> pb.SubmitMemberResponse:
        t0 = perf()
        resp: pb.SubmitMemberResponse = await side.unary(req, timeout=60.0)
        lat.append(perf() - t0)
        return resp

    responses = await asyncio.gather(*(one(r) for r in reqs))
    if check:
        for resp in responses:
            check_result(resp.result)


async def stream_group(
    side: Side, reqs: Sequence[pb.SubmitMemberRequest], lat: list[float], check: bool
) -> None:
    perf = time.perf_counter
    t0 = perf()
    call = side.stream(iter([pb.StreamGroupsRequest(member=r) for r in reqs]), timeout=60.0)
    results = 0
    async for event in call:
        kind = event.WhichOneof("event")
        if kind == "result":
            lat.append(perf() - t0)
            results += 1
            if check:
                check_result(event.result)
        elif kind == "error":
            raise RuntimeError(f"stream error event: {event.error}")
    if results != len(reqs):
        raise RuntimeError(f"stream ended with {results} of {len(reqs)} results")


async def drive(
    side: Side,
    api: str,
    groups: Sequence[Sequence[pb.SubmitMemberRequest]],
    in_flight: int,
) -> Drive:
    gate = asyncio.Semaphore(in_flight)
    member_lat: list[float] = []
    group_lat: list[float] = []
    run = unary_group if api == "SubmitMember" else stream_group
    check = side.name == "service"

    async def one(reqs: Sequence[pb.SubmitMemberRequest]) -> None:
        async with gate:
            t0 = time.perf_counter()
            await run(side, reqs, member_lat, check)
            group_lat.append(time.perf_counter() - t0)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(g) for g in groups))
    elapsed = time.perf_counter() - t0
    return Drive(
        side=side.name,
        api=api,
        in_flight=in_flight,
        groups=len(groups),
        members=sum(len(g) for g in groups),
        elapsed_s=elapsed,
        cpu_s=time.process_time() - cpu0,
        member_latencies=member_lat,
        group_latencies=group_lat,
    )


async def record_script(port: int, size: int, answer_bytes: int) -> EchoScript:
    """Run one real group per API on the service and keep the exact response bytes."""
    script = EchoScript()
    side = Side("service", port, SERVICE)
    try:
        reqs = group_requests("script-unary", 0, size, answer_bytes)
        responses = await asyncio.gather(*(side.unary(r, timeout=60.0) for r in reqs))
        for req, resp in zip(reqs, responses, strict=True):
            check_result(resp.result)
            script.unary[req.member.rollout_index] = resp.SerializeToString()
        reqs = group_requests("script-stream", 0, size, answer_bytes)
        call = side.stream(iter([pb.StreamGroupsRequest(member=r) for r in reqs]), timeout=60.0)
        async for event in call:
            if event.WhichOneof("event") == "accepted":
                script.accepted[event.accepted.member.rollout_index] = event.SerializeToString()
            else:
                script.rest.append(event.SerializeToString())
    finally:
        await side.close()
    if len(script.accepted) != size or len(script.unary) != size:
        raise RuntimeError("could not record a full group from the service")
    return script


# ----------------------------------------------------------------------------- echo / sweep
@dataclass(slots=True)
class EchoPlan:
    group_size: int = 16
    answer_bytes: int = 4096
    in_flight: int = 32
    groups: int = 160
    rounds: int = 3
    sweep_levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48)
    sweep_min_groups: int = 16
    sweep_groups_per_level: int = 4
    warmup_groups: int = 32


class Pair:
    """The service (instant judge) and the echo servicer, both up for a whole section."""

    def __init__(self, plan: EchoPlan) -> None:
        self.plan = plan
        self.judge = InstantJudge()
        self.seq = 0
        self.script = EchoScript()
        self._service: CohortServer | None = None
        self._echo: Any = None
        self.sides: dict[str, Side] = {}

    async def __aenter__(self) -> Pair:
        plan = self.plan
        self._service = await start_service(
            self.judge,
            group_size=plan.group_size,
            max_terminal_cohorts=4096,
        )
        self.script = await record_script(self._service.port, plan.group_size, plan.answer_bytes)
        self._echo, echo_port = await start_echo(self.script)
        self.sides = {
            "service": Side("service", self._service.port, SERVICE),
            "echo": Side("echo", echo_port, ECHO),
        }
        # Warm both channels and both servers up (connections, code paths, caches).
        for name in ("service", "echo"):
            for api in ("SubmitMember", "StreamGroups"):
                await self.run(name, api, groups=plan.warmup_groups, in_flight=plan.in_flight)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for side in self.sides.values():
            await side.close()
        if self._echo is not None:
            await self._echo.stop(None)
        if self._service is not None:
            await self._service.stop()

    async def run(self, name: str, api: str, *, groups: int, in_flight: int) -> Drive:
        plan = self.plan
        self.seq += 1
        prefix = f"{name}-{api}-{self.seq}"
        reqs = [
            group_requests(prefix, n, plan.group_size, plan.answer_bytes) for n in range(groups)
        ]
        return await drive(self.sides[name], api, reqs, in_flight)


@dataclass(slots=True)
class EchoResult:
    plan: dict[str, Any]
    script_sizes: dict[str, int]
    runs: list[dict[str, Any]]
    #: api → side → median over rounds of members/s, and latency percentiles pooled.
    summary: dict[str, dict[str, dict[str, float]]]
    #: api → median over rounds of (service members/s ÷ echo members/s) in that round.
    ratio: dict[str, float]
    ratio_rounds: dict[str, list[float]]
    #: api → side → pooled member latencies (ms), for the CDF plot.
    latencies_ms: dict[str, dict[str, list[float]]]
    judge_calls: int
    judge_calls_expected: int
    sweep: list[dict[str, Any]]


APIS = ("SubmitMember", "StreamGroups")


async def bench_echo(plan: EchoPlan, *, sweep: bool = True) -> EchoResult:
    async with Pair(plan) as pair:
        judge_before = pair.judge.calls
        service_groups = 0
        drives: list[Drive] = []
        for round_ in range(plan.rounds):
            order = ("echo", "service") if round_ % 2 == 0 else ("service", "echo")
            for api in APIS:
                for name in order:
                    d = await pair.run(name, api, groups=plan.groups, in_flight=plan.in_flight)
                    drives.append(d)
                    if name == "service":
                        service_groups += d.groups
        summary: dict[str, dict[str, dict[str, float]]] = {}
        ratios: dict[str, float] = {}
        ratio_rounds: dict[str, list[float]] = {}
        lats: dict[str, dict[str, list[float]]] = {}
        for api in APIS:
            summary[api] = {}
            lats[api] = {}
            for name in ("service", "echo"):
                mine = [d for d in drives if d.api == api and d.side == name]
                member = [t for d in mine for t in d.member_latencies]
                group = [t for d in mine for t in d.group_latencies]
                summary[api][name] = {
                    "members_per_s": median([d.members_per_s for d in mine]),
                    "cpu_us_per_member": median([d.cpu_s / d.members * 1e6 for d in mine]),
                    "member_p50_ms": percentile(member, 0.5) * 1e3,
                    "member_p99_ms": percentile(member, 0.99) * 1e3,
                    "group_p50_ms": percentile(group, 0.5) * 1e3,
                    "group_p99_ms": percentile(group, 0.99) * 1e3,
                }
                lats[api][name] = [t * 1e3 for t in member]
            per_round = [
                ratio(s.members_per_s, e.members_per_s)
                for s, e in zip(
                    [d for d in drives if d.api == api and d.side == "service"],
                    [d for d in drives if d.api == api and d.side == "echo"],
                    strict=True,
                )
            ]
            ratio_rounds[api] = per_round
            ratios[api] = median(per_round)
        judge_calls = pair.judge.calls - judge_before
        sweep_rows: list[dict[str, Any]] = []
        if sweep:
            for k, level in enumerate(plan.sweep_levels):
                groups = max(plan.sweep_min_groups, plan.sweep_groups_per_level * level)
                order = ("echo", "service") if k % 2 == 0 else ("service", "echo")
                for api in APIS:
                    for name in order:
                        d = await pair.run(name, api, groups=groups, in_flight=level)
                        sweep_rows.append(d.summary())
    return EchoResult(
        plan={
            "group_size": plan.group_size,
            "answer_bytes": plan.answer_bytes,
            "in_flight": plan.in_flight,
            "groups": plan.groups,
            "rounds": plan.rounds,
            "sweep_levels": list(plan.sweep_levels),
        },
        script_sizes=pair.script.sizes(),
        runs=[d.summary() for d in drives],
        summary=summary,
        ratio=ratios,
        ratio_rounds=ratio_rounds,
        latencies_ms=lats,
        judge_calls=judge_calls,
        judge_calls_expected=service_groups * plan.group_size,
        sweep=sweep_rows,
    )


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
        store_counts = dict(server.registry.store.counts())
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
