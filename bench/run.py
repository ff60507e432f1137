"""``make bench``: the multi-process service benchmarks, then in-process micro-benchmarks.

Multi-process (``bench/multiproc.py``; load generator, server, judge and baselines are
separate processes): ``throughput``, ``single``, ``saturation``, ``retained``,
``profile``.

In-process (one interpreter, as micro-benchmarks of one part):

- ``core``     — ``CohortRegistry.submit`` on a ``MemoryStore`` pre-filled with 100 …
                 50,000 terminal explicit cohorts: µs per call and store records examined
                 per call. Must be flat.
- ``pinned``   — the same mix while more groups are active than the watermark cap.
- ``schedule`` — 16 groups at once with ``judge_max_concurrency=8``: under the priority
                 scheduler cohorts finish one after another, not all at the end.
- ``storm``, ``eager`` (``bench/service.py``), ``memory`` (``bench/memory.py``).

``python -m bench.run [--quick] [--only SECTION]``; results also go to
``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import logging
import math
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient

from bench import launch, memory, report
from bench.mpreport import keep_sections
from bench.multiproc import MP_SECTIONS, QUICK_MULTI, MultiPlan, run_multi
from bench.service import (
    EagerPlan,
    StormPlan,
    bench_eager,
    bench_storm,
    start_service,
)
from bench.util import machine_info, percentile, ratio, table
from genrm_grpc.cohort.identity import CandidateInput, resolve
from genrm_grpc.cohort.model import (
    CandidateSpec,
    CohortKey,
    Completed,
    MemberCoords,
    MemberReward,
    PromptSpec,
    Reason,
    Submission,
    Tombstone,
)
from genrm_grpc.cohort.records import CohortStore
from genrm_grpc.cohort.registry import CohortRegistry, Disposition
from genrm_grpc.config import Settings
from genrm_grpc.store.memory import MemoryStore
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

RESULTS_PATH = pathlib.Path(__file__).resolve().parent / "results" / "latest.json"
SECTIONS = (*MP_SECTIONS, "core", "pinned", "schedule", "storm", "eager", "memory")
DOCS_DIR = pathlib.Path(__file__).resolve().parent.parent / "docs"
QUICK_DOCS_DIR = RESULTS_PATH.parent / "quick"
#: A retention long enough that nothing expires during a run (only the count cap evicts).
LONG_TTL_S = 1e7


@dataclass(frozen=True, slots=True)
class Plan:
    retained: tuple[int, ...] = (100, 1_000, 10_000, 50_000)
    core_ops: int = 20_000
    core_rounds: int = 3
    pinned_cap: int = 1_000
    pinned_active: tuple[int, ...] = (500, 5_000)
    pinned_ops: int = 10_000
    group_size: int = 8
    sched_groups: int = 16
    sched_concurrency: int = 8
    sched_latency_ms: str = "20"
    multi: MultiPlan = field(default_factory=MultiPlan)
    storm: StormPlan = field(default_factory=StormPlan)
    eager: EagerPlan = field(default_factory=EagerPlan)
    memory_active: int = 1_000
    memory_tombstones: int = 2_000
    seed: int = 0
    sections: tuple[str, ...] = SECTIONS


QUICK = Plan(
    core_ops=4_000,
    core_rounds=1,
    pinned_ops=2_000,
    multi=QUICK_MULTI,
    storm=StormPlan(groups=24),
    eager=EagerPlan(groups=8, rounds=2, start_spread_s=0.4, arrival_median_s=0.2),
    memory_active=200,
    memory_tombstones=400,
)


# ----------------------------------------------------------------------------- helpers
class WarningCounter(logging.Handler):
    """Counts the service's warnings (judge retries above all) instead of printing each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        template = str(record.msg)
        self.counts[template] += 1
        self.examples.setdefault(template, record.getMessage()[:200])

    def judge_retries(self) -> int:
        return sum(n for t, n in self.counts.items() if t.startswith("judge attempt"))


WARNINGS = WarningCounter()


def completed_outcome(size: int) -> Completed:
    return Completed(rewards=tuple(MemberReward(3.0, 3.0, 3.0, 0.0) for _ in range(size)))


def prefill(
    store: CohortStore,
    count: int,
    *,
    prefix: str,
    attempt: int,
    group_size: int,
    prompt_digest: str,
    digests: dict[int, str],
    outcome: Completed,
    now: float,
) -> list[str]:
    """Put ``count`` terminal explicit cohorts (tombstone + watermark) into ``store``."""
    gids = [f"{prefix}-{n}" for n in range(count)]
    for gid in gids:
        key = CohortKey(group_id=gid, legacy_key=None, attempt=attempt)
        store.raise_watermark(key.group_scope or gid, attempt, now)
        store.put_tombstone(
            Tombstone(
                key=key,
                group_size=group_size,
                prompt_digest=prompt_digest,
                digests=dict(digests),
                outcome=outcome,
                finished_at=now,
            ),
            now,
        )
    return gids


# ----------------------------------------------------------------------------- 1. core
CORE_PROMPT = PromptSpec(messages=(("system", "Be brief."), ("user", "Name the largest planet.")))
CORE_SIZE = 2
CORE_ATTEMPT = 1

#: One cycle of registry events. "new"/"attach"/"fill" drive one fresh cohort of size 2
#: through collecting → evaluating; it then finishes (timed as "finish") and leaves a
#: tombstone, so the store stays at its cap and evicts on every cycle.
CORE_CYCLE = ("replay", "new", "replay", "attach", "superseded", "fill")
EXPECTED = {
    "replay": Disposition.REPLAYED,
    "new": Disposition.ACCEPTED,
    "attach": Disposition.ATTACHED,
    "superseded": Disposition.REJECTED,
    "fill": Disposition.ACCEPTED,
}


@dataclass(frozen=True, slots=True)
class CoreFixture:
    prompt_digest: str
    candidates: tuple[CandidateSpec, ...]
    outcome: Completed

    @classmethod
    def build(cls) -> CoreFixture:
        subs = []
        for i in range(CORE_SIZE):
            got = resolve(
                MemberCoords(rollout_index=i, group_id="x", group_attempt=0, group_size=CORE_SIZE),
                CORE_PROMPT,
                CandidateInput(output_text=f"answer {i}: Jupiter", reasoning_text="thinking"),
                default_group_size=CORE_SIZE,
                mode="rollout_cohort",
            )
            assert isinstance(got, Submission), got
            subs.append(got)
        return cls(
            prompt_digest=subs[0].prompt_digest,
            candidates=tuple(s.candidate for s in subs),
            outcome=completed_outcome(CORE_SIZE),
        )

    def submission(self, gid: str, index: int, attempt: int = CORE_ATTEMPT) -> Submission:
        return Submission(
            coords=MemberCoords(
                rollout_index=index, group_id=gid, group_attempt=attempt, group_size=CORE_SIZE
            ),
            key=CohortKey(group_id=gid, legacy_key=None, attempt=attempt),
            group_size=CORE_SIZE,
            prompt=CORE_PROMPT,
            prompt_digest=self.prompt_digest,
            candidate=self.candidates[index],
        )


@dataclass(slots=True)
class CoreSample:
    retained: int
    extra_active: int
    ops: int
    mean_us: float
    p50_us: float
    p99_us: float
    max_us: float
    by_kind_mean_us: dict[str, float]
    finish_mean_us: float
    examined_per_request: float
    store_counts: dict[str, int]


def core_round(
    fixture: CoreFixture,
    *,
    retained: int,
    cap: int,
    ops: int,
    rng: random.Random,
    extra_active: int = 0,
    cycle: Sequence[str] = CORE_CYCLE,
) -> CoreSample:
    """Time ``ops`` registry.submit calls against ``retained`` pre-filled terminal cohorts."""
    if retained < 3:
        raise ValueError("retained must be >= 3")
    settings = Settings(
        cohort_collection_timeout_s=LONG_TTL_S,
        cohort_evaluation_timeout_s=LONG_TTL_S,
        max_active_cohorts=max(10_000, extra_active + 10),
        cohort_result_ttl_s=LONG_TTL_S,
        max_terminal_cohorts=cap,
    )
    store = MemoryStore(settings)
    registry = CohortRegistry(settings, store)
    now = 1000.0
    ended = prefill(
        store,
        retained,
        prefix="old",
        attempt=CORE_ATTEMPT,
        group_size=CORE_SIZE,
        prompt_digest=fixture.prompt_digest,
        digests={i: c.digest for i, c in enumerate(fixture.candidates)},
        outcome=fixture.outcome,
        now=now,
    )
    # Groups that stay collecting for the whole run (their watermarks are pinned).
    for n in range(extra_active):
        registry.submit(fixture.submission(f"active-{n}", 0), now)
    # Replay targets come from the newest terminal cohorts, which the cap never evicts
    # during the cycle (at most one cohort is active at a time).
    window = min(retained, cap) - 2
    samples: list[int] = []
    by_kind: dict[str, list[int]] = {kind: [] for kind in cycle}
    finish: list[int] = []
    perf = time.perf_counter_ns
    gc.collect()
    examined_before = registry.evictions_examined
    done = 0
    n_cycle = 0
    while done < ops:
        gid = f"run-{n_cycle}"
        n_cycle += 1
        for kind in cycle:
            if done >= ops:
                break
            now += 1e-4
            if kind == "replay":
                sub = fixture.submission(ended[-1 - rng.randrange(window)], rng.randrange(2))
            elif kind == "superseded":
                target = ended[-1 - rng.randrange(window)]
                sub = fixture.submission(target, 0, attempt=CORE_ATTEMPT - 1)
            else:
                sub = fixture.submission(gid, 1 if kind == "fill" else 0)
            t0 = perf()
            decision = registry.submit(sub, now)
            elapsed = perf() - t0
            samples.append(elapsed)
            by_kind[kind].append(elapsed)
            done += 1
            if decision.disposition is not EXPECTED[kind] or (
                kind == "superseded"
                and (
                    decision.rejection is None
                    or decision.rejection.reason is not Reason.ATTEMPT_SUPERSEDED
                )
            ):
                raise RuntimeError(f"{kind}: unexpected decision {decision!r}")
            if kind == "fill":
                cohort = decision.cohort
                if not decision.frozen or cohort is None:
                    raise RuntimeError(f"fill did not freeze the cohort: {decision!r}")
                now += 1e-4
                t0 = perf()
                ok = registry.evaluation_finished(cohort, fixture.outcome, now)
                finish.append(perf() - t0)
                if not ok:
                    raise RuntimeError("evaluation_finished refused a completed cohort")
                ended.append(gid)
    examined = registry.evictions_examined - examined_before
    return CoreSample(
        retained=retained,
        extra_active=extra_active,
        ops=len(samples),
        mean_us=statistics.fmean(samples) / 1e3,
        p50_us=percentile(samples, 0.50) / 1e3,
        p99_us=percentile(samples, 0.99) / 1e3,
        max_us=max(samples) / 1e3,
        by_kind_mean_us={k: statistics.fmean(v) / 1e3 for k, v in by_kind.items() if v},
        finish_mean_us=statistics.fmean(finish) / 1e3 if finish else math.nan,
        examined_per_request=examined / len(samples),
        store_counts=dict(store.counts()),
    )


def merge_rounds(rounds: Sequence[CoreSample]) -> CoreSample:
    """Median over rounds of each statistic (rounds are interleaved across sizes)."""

    def med(get: Callable[[CoreSample], float]) -> float:
        return statistics.median(get(r) for r in rounds)

    first = rounds[-1]
    kinds = first.by_kind_mean_us.keys()
    return replace(
        first,
        ops=sum(r.ops for r in rounds),
        mean_us=med(lambda r: r.mean_us),
        p50_us=med(lambda r: r.p50_us),
        p99_us=med(lambda r: r.p99_us),
        max_us=max(r.max_us for r in rounds),
        by_kind_mean_us={k: statistics.median(r.by_kind_mean_us[k] for r in rounds) for k in kinds},
        finish_mean_us=med(lambda r: r.finish_mean_us),
        examined_per_request=med(lambda r: r.examined_per_request),
    )


def bench_core(plan: Plan) -> list[CoreSample]:
    fixture = CoreFixture.build()
    rng = random.Random(plan.seed)
    rounds: dict[int, list[CoreSample]] = {n: [] for n in plan.retained}
    # Warm up the interpreter's caches on a small store first.
    core_round(fixture, retained=100, cap=100, ops=min(plan.core_ops, 2_000), rng=rng)
    for _ in range(plan.core_rounds):
        for retained in plan.retained:
            sample = core_round(
                fixture, retained=retained, cap=retained, ops=plan.core_ops, rng=rng
            )
            rounds[retained].append(sample)
            gc.collect()
    return [merge_rounds(rounds[n]) for n in plan.retained]


def bench_pinned(plan: Plan) -> list[CoreSample]:
    fixture = CoreFixture.build()
    rng = random.Random(plan.seed + 1)
    # No "superseded" op here: with more active groups than the cap, terminal groups'
    # watermarks are (correctly) evicted first, so an old attempt is no longer fenced.
    cycle = ("replay", "new", "replay", "attach", "fill")
    return [
        core_round(
            fixture,
            retained=plan.pinned_cap,
            cap=plan.pinned_cap,
            ops=plan.pinned_ops,
            rng=rng,
            extra_active=active,
            cycle=cycle,
        )
        for active in plan.pinned_active
    ]


# ----------------------------------------------------------------------------- schedule helpers
QUESTIONS = (
    "Explain unit testing briefly.",
    "Why is the sky blue? Answer in two sentences.",
    "Name three uses of a hash table and explain one of them.",
    "What does a reward model do in reinforcement learning from feedback?",
)
ANSWERS = (
    "Unit testing checks small pieces of code in isolation so that bugs are caught early.",
    "Testing units.",
    "Unit testing is a way to test each unit of code briefly and explain failures clearly.",
    "",
    "The sky looks blue because air molecules scatter short blue wavelengths of sunlight "
    "much more than red ones, so blue light reaches our eyes from every direction.",
    "Hash tables give caches, symbol tables and sets; a cache maps keys to stored results.",
    "A reward model scores answers so that training can prefer the better ones.",
    "I am not sure.",
)


def group_prompt(n: int) -> pb.Prompt:
    return pb.Prompt(messages=[pb.ChatMessage(role="user", content=QUESTIONS[n % len(QUESTIONS)])])


async def run_group(client: CohortClient, gid: str, n: int, size: int) -> None:
    """Submit a whole group concurrently and check every member got a real reward."""
    prompt = group_prompt(n)
    calls = [
        client.submit_member(
            pb.MemberRef(group_id=gid, group_attempt=0, rollout_index=i, group_size=size),
            prompt,
            pb.Candidate(output_text=ANSWERS[i % len(ANSWERS)]),
            timeout=120.0,
        )
        for i in range(size)
    ]
    results = await asyncio.gather(*calls)
    for result in results:
        if result.replayed or result.mask_sample or not math.isfinite(result.reward):
            raise RuntimeError(f"group {gid}: unexpected result {result}")


async def run_groups(
    client: CohortClient, *, prefix: str, groups: int, in_flight: int, size: int
) -> list[float]:
    """Run ``groups`` groups with at most ``in_flight`` at once; per-group latencies (s)."""
    gate = asyncio.Semaphore(in_flight)
    latencies: list[float] = []

    async def one(n: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            await run_group(client, f"{prefix}-{n}", n, size)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(one(n) for n in range(groups)))
    return latencies


# ----------------------------------------------------------------------------- schedule
@dataclass(slots=True)
class ScheduleResult:
    groups: int
    group_size: int
    judge_max_concurrency: int
    judge_latency_ms: str
    completion_ms: list[float]
    first_ms: float
    median_ms: float
    last_ms: float
    judge_calls: int
    judge_retries: int


async def bench_schedule(plan: Plan) -> ScheduleResult:
    size = plan.group_size
    config = FakeJudgeConfig(latency_ms=plan.sched_latency_ms, seed=plan.seed)
    with FakeJudgeServer(config) as judge:
        server = await start_service(
            None,
            group_size=size,
            judge_url=judge.url,
            judge_max_concurrency=plan.sched_concurrency,
        )
        client = CohortClient(f"127.0.0.1:{server.port}")
        try:
            # Open the gRPC channel and the judge connections before timing.
            await run_groups(client, prefix="warmup", groups=2, in_flight=2, size=size)
            judge.reset_stats()
            retries_before = WARNINGS.judge_retries()
            t0 = time.perf_counter()
            done: list[float] = []

            async def one(n: int) -> None:
                await run_group(client, f"sched-{n}", n, size)
                done.append(time.perf_counter() - t0)

            await asyncio.gather(*(one(n) for n in range(plan.sched_groups)))
            judged = int(judge.stats()["total"])
            retries = WARNINGS.judge_retries() - retries_before
        finally:
            await client.close()
            await server.stop()
    times = sorted(t * 1e3 for t in done)
    return ScheduleResult(
        groups=plan.sched_groups,
        group_size=size,
        judge_max_concurrency=plan.sched_concurrency,
        judge_latency_ms=plan.sched_latency_ms,
        completion_ms=times,
        first_ms=times[0],
        median_ms=statistics.median(times),
        last_ms=times[-1],
        judge_calls=judged,
        judge_retries=retries,
    )


# ----------------------------------------------------------------------------- report


def report_core(samples: Sequence[CoreSample], title: str) -> str:
    kinds = list(samples[0].by_kind_mean_us)
    headers = [
        "retained",
        "active",
        "mean µs",
        "p50 µs",
        "p99 µs",
        *(f"{k} µs" for k in kinds),
        "finish µs",
        "examined/req",
    ]
    rows = [
        [
            f"{s.retained:,}",
            f"{s.extra_active:,}",
            f"{s.mean_us:.2f}",
            f"{s.p50_us:.2f}",
            f"{s.p99_us:.2f}",
            *(f"{s.by_kind_mean_us[k]:.2f}" for k in kinds),
            f"{s.finish_mean_us:.2f}",
            f"{s.examined_per_request:.2f}",
        ]
        for s in samples
    ]
    return f"{title}\n{table(headers, rows)}"


def core_ratios(samples: Sequence[CoreSample]) -> dict[str, float]:
    lo, hi = samples[0], samples[-1]
    return {
        "mean": ratio(hi.mean_us, lo.mean_us),
        "p50": ratio(hi.p50_us, lo.p50_us),
        "p99": ratio(hi.p99_us, lo.p99_us),
        "examined": ratio(hi.examined_per_request, lo.examined_per_request),
    }


def report_schedule(s: ScheduleResult) -> str:
    step = float(s.judge_latency_ms) if s.judge_latency_ms.replace(".", "").isdigit() else None
    times = ", ".join(f"{t:.0f}" for t in s.completion_ms)
    steps = [b - a for a, b in itertools.pairwise(s.completion_ms)]
    lines = [
        f"3. Judge scheduling ({s.groups} groups of {s.group_size} at once, "
        f"judge_max_concurrency={s.judge_max_concurrency}, judge latency {s.judge_latency_ms} ms,"
        f" {s.judge_calls} judge calls, {s.judge_retries} retries)",
        f"   first {s.first_ms:.0f} ms   median {s.median_ms:.0f} ms   last {s.last_ms:.0f} ms",
        f"   sorted completion times (ms): {times}",
        f"   median step between consecutive cohorts: {statistics.median(steps):.0f} ms"
        if steps
        else "",
    ]
    if step is not None:
        per_cohort = step * s.group_size / s.judge_max_concurrency
        lines.append(
            f"   ideal staircase: cohort k done at ≈ k × {per_cohort:.0f} ms "
            f"(first {per_cohort:.0f}, last {per_cohort * s.groups:.0f}); "
            f"fair sharing would finish all near {per_cohort * s.groups:.0f} ms"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
async def run_async(plan: Plan, out: dict[str, Any]) -> None:
    if "schedule" in plan.sections:
        sched = await bench_schedule(plan)
        out["schedule"] = asdict(sched)
        print(report_schedule(sched) + "\n", flush=True)
    if "storm" in plan.sections:
        storm = await bench_storm(replace(plan.storm, seed=plan.seed))
        out["storm"] = asdict(storm)
        print(
            f"storm: {storm.sends:,} sends for {storm.members:,} members "
            f"({storm.cancelled_by_client} cancelled, {storm.dropped_connections} dropped, "
            f"{storm.replayed} replayed); judge calls {storm.judge_calls:,} / ideal "
            f"{storm.judge_calls_ideal:,} = {storm.ratio:.3f}",
            flush=True,
        )
    if "eager" in plan.sections:
        eager = await bench_eager(replace(plan.eager, seed=plan.seed))
        out["eager"] = asdict(eager)
        print(
            f"eager vs after_collection: post-collection median {eager.post_median_ms['eager']:.0f}"
            f" vs {eager.post_median_ms['after_collection']:.0f} ms → ratio {eager.ratio:.2f}",
            flush=True,
        )


def parse_args(
    argv: Sequence[str] | None,
) -> tuple[Plan, pathlib.Path, pathlib.Path | None, pathlib.Path | None, pathlib.Path | None, bool]:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (~2-3 min)")
    parser.add_argument("--ops", type=int, help="registry.submit calls per retained size")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the core benchmark")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument(
        "--only", action="append", choices=SECTIONS, help="run only this section (repeatable)"
    )
    parser.add_argument(
        "--output", type=pathlib.Path, default=RESULTS_PATH, help="JSON results file"
    )
    parser.add_argument(
        "--docs",
        type=pathlib.Path,
        help="write performance.md and performance/ (plots, results.json) here "
        "(default: docs/ for a full run, bench/results/quick/ with --quick)",
    )
    parser.add_argument(
        "--render",
        type=pathlib.Path,
        metavar="RESULTS_JSON",
        help="measure nothing: rewrite the report from a saved results.json",
    )
    parser.add_argument(
        "--keep-logs",
        type=pathlib.Path,
        help="keep the multi-process logs, configs and py-spy output in this directory",
    )
    parser.add_argument(
        "--gym",
        action="store_true",
        help="also run the vs NeMo Gym section (bench/gym_peer.py; needs the Gym venv); "
        "a full run does by default",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    changes: dict[str, Any] = {
        "core_ops": args.ops,
        "core_rounds": args.rounds,
        "seed": args.seed,
        "sections": tuple(args.only) if args.only else None,
    }
    plan = replace(plan, **{k: v for k, v in changes.items() if v is not None})
    return plan, args.output, args.docs, args.keep_logs, args.render, args.gym


def main(argv: Sequence[str] | None = None) -> int:
    plan, output, docs_dir, keep_logs, rendered, gym = parse_args(argv)
    if rendered is not None:
        return render(rendered, docs_dir)
    logging.getLogger("genrm_grpc").addHandler(WARNINGS)
    started = time.perf_counter()
    machine = machine_info()
    out: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": plan == replace(QUICK, sections=plan.sections, seed=plan.seed),
        "plan": asdict(plan),
        "machine": machine,
    }
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['mem_gib']} GiB, "
        f"Python {machine['python']}, grpcio {machine['grpcio']}\n",
        flush=True,
    )
    multi = replace(plan.multi, sections=tuple(s for s in plan.sections if s in MP_SECTIONS))
    out["multi_plan"] = asdict(multi)
    if multi.sections:
        run_multi(multi, out, keep_logs)
    if "core" in plan.sections:
        core = bench_core(plan)
        ratios = core_ratios(core)
        out["core"] = [asdict(s) for s in core]
        out["core_ratio"] = ratios
        title = (
            f"1. Core: CohortRegistry.submit vs retained terminal cohorts "
            f"({plan.core_ops:,} calls x {plan.core_rounds} rounds, MemoryStore at its cap; "
            f"mix per cycle {'/'.join(CORE_CYCLE)}, then finish)"
        )
        print(report_core(core, title))
        verdict = "flat" if ratios["mean"] < 1.5 and ratios["examined"] < 1.5 else "GROWS"
        print(
            f"   {core[-1].retained:,} vs {core[0].retained:,} retained: mean ×"
            f"{ratios['mean']:.2f}, p99 ×{ratios['p99']:.2f}, examined/req ×"
            f"{ratios['examined']:.2f} → {verdict}\n",
            flush=True,
        )
    if "pinned" in plan.sections:
        pinned = bench_pinned(plan)
        out["pinned"] = [asdict(s) for s in pinned]
        title = (
            f"1b. Core with more active groups than the watermark cap "
            f"(max_terminal_cohorts={plan.pinned_cap:,}; {plan.pinned_ops:,} calls)"
        )
        print(report_core(pinned, title) + "\n", flush=True)
    if "memory" in plan.sections:
        mem: dict[str, dict[str, Any]] = {"active": {}, "tombstone": {}}
        for kind, count in (("active", plan.memory_active), ("tombstone", plan.memory_tombstones)):
            for method in ("tracemalloc", "rss"):
                mem[kind][method] = memory.run_isolated(kind, method, count)
                print(
                    f"memory {kind} ({method}, {count:,}): "
                    f"{mem[kind][method]['bytes_per_item'] / 1024:,.2f} KiB each",
                    flush=True,
                )
        out["memory"] = mem
    asyncio.run(run_async(plan, out))
    out["duration_s"] = round(time.perf_counter() - started, 1)
    out["loadavg_end"] = list(os.getloadavg())
    out["warnings"] = dict(WARNINGS.counts)
    for template, count in WARNINGS.counts.most_common():
        print(f"warning logged {count}x (incl. warm-up), e.g.: {WARNINGS.examples[template]}")
    text = json.dumps(out, indent=2, allow_nan=True) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    docs = write_docs(out, docs_dir)
    print(f"total {out['duration_s']} s; results written to {output}; report {docs}/performance.md")
    if gym or (plan.sections == SECTIONS and not out["quick"]):
        return run_gym_peer(docs)
    return 0


def run_gym_peer(docs: pathlib.Path) -> int:
    """The "vs NeMo Gym genrm_compare" section (``bench/gym_peer.py``) under the Gym venv
    (``GYM_VENV``, default ``build/gym-venv``, built by ``make test-integrations`` or
    ``make bench-gym``), written into ``DOCS/performance.md``; skipped without it."""
    venv = pathlib.Path(os.environ.get("GYM_VENV") or launch.ROOT / "build" / "gym-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"vs NeMo Gym: skipped, no Gym venv at {venv} (make bench-gym builds it)")
        return 0
    argv = [
        str(python),
        "-m",
        "bench.gym_peer",
        "--docs",
        str(docs / "performance.md"),
        "--out",
        str(docs / "performance" / "gym-peer.json"),
    ]
    env = {**os.environ, **launch.gym_env()}
    return subprocess.run(argv, env=env, cwd=launch.ROOT, check=False).returncode


def write_docs(out: dict[str, Any], docs_dir: pathlib.Path | None) -> pathlib.Path:
    """performance.md, its plots and results.json from one run's results; the page's kept
    sections are carried over from the file it replaces."""
    docs = docs_dir if docs_dir is not None else (QUICK_DOCS_DIR if out["quick"] else DOCS_DIR)
    assets = docs / "performance"
    plots = report.write_plots(out, assets)
    (assets / "results.json").write_text(json.dumps(out, indent=2, allow_nan=True) + "\n")
    page = docs / "performance.md"
    old = page.read_text() if page.exists() else None
    page.write_text(keep_sections(report.markdown(out, plots, "performance"), old))
    return docs


def render(results: pathlib.Path, docs_dir: pathlib.Path | None) -> int:
    """Rewrite the report from a saved results.json (no measuring)."""
    out = json.loads(results.read_text())
    docs = write_docs(out, docs_dir)
    print(f"report {docs}/performance.md rendered from {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
