"""The multi-process benchmark: load generator, server, judge and baselines as processes.

Every process is started by ``bench/launch.py`` through its public interface —
``genrm-grpc serve --config``, ``python -m bench.judge`` (an aiohttp judge with an
in-flight gauge), ``python -m bench.baseline`` (bare grpc.aio servicers of the same
proto) and ``python -m bench.loadgen`` (JSON commands on stdin) — so the harness keeps
working whatever the server's internals become. Server CPU is read from
``/proc/PID/stat`` (user + system time of all its threads) before and after each run;
judge counters from its ``/stats``.

Sections (each compares its sides in the same run, alternating the order round by round
— ABAB — and reports the median and the spread of the rounds):

- ``throughput``  16-member groups, instant judge: the service vs the echo-plus-judge
                  baseline (same judge bodies, same concurrency bound), SubmitMember and
                  StreamGroups; server CPU per member and per judge call.
- ``single``      1-member groups (no judge call): the service on ``memory://`` and on
                  the default store (a fresh SQLite file) vs a bare echo.
- ``saturation``  judge latency L = 100 ms, ``judge_max_concurrency`` C = 16, 64, 256:
                  judge calls/s ÷ (C / L) in the steady state, and the most requests the
                  judge ever saw in flight (must never exceed C).
- ``retained``    p99 member latency with 100 vs 50,000 retained cohorts (two servers,
                  the store at its cap so every new cohort evicts one).
- ``profile``     py-spy on the server while it serves 1-member groups (both APIs) and
                  16-member groups, on ``memory://``, then SubmitMember on the default
                  store with both sizes; the server's CPU per thread over each run.
- ``store``       the SQLite store (a fresh file per server) vs ``memory://``: 16-member
                  groups on both APIs; restart recovery time of a real ``genrm-grpc
                  serve`` on a file holding 10,000 retained and 100 active cohorts vs an
                  empty one (exec → "serving on" → first answered GetCohort); the file's
                  bytes per retained cohort.
- ``replicas``    one replica on ``memory://``, one on ``redis://`` and three on one
                  ``redis://`` (``bench/replicas.py``): throughput, CPU, Redis round
                  trips and commands per member.

Every ``genrm-grpc serve`` gets its store through ``GENRM_STORE``: ``memory://``, except
the SQLite sides of ``single``, ``profile`` and ``store`` (a fresh file each in the run's log
directory).
"""

from __future__ import annotations

import collections
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.launch import (
    Judge,
    LoadGen,
    Proc,
    fresh_store,
    start_baseline,
    start_service,
)

APIS = ("SubmitMember", "StreamGroups")
MP_SECTIONS = ("throughput", "single", "saturation", "retained", "profile", "store", "replicas")


@dataclass(frozen=True, slots=True)
class MultiPlan:
    rounds: int = 3
    group_size: int = 16
    in_flight: int = 32
    answer_bytes: int = 2048
    groups: int = 96
    warmup_groups: int = 16
    concurrency: int = 64
    single_groups: int = 1500
    single_in_flight: int = 128
    sat_levels: tuple[int, ...] = (16, 64, 256)
    sat_latency_ms: float = 100.0
    sat_rounds: int = 2
    sat_warmup_s: float = 1.0
    sat_window_s: float = 3.0
    retained: tuple[int, ...] = (100, 50_000)
    #: Many short rounds, sides alternating: background load on the shared machine then
    #: falls on both sides alike instead of on one side's whole run.
    retained_rounds: int = 8
    retained_groups: int = 40
    #: Few groups in flight: latency then shows pauses rather than queueing behind load.
    retained_in_flight: int = 4
    profile_s: float = 5.0
    #: Restart recovery: a store file with this many retained (completed 16-member
    #: cohorts, 16 journaled passes each) and active (collecting, 16 members) cohorts.
    store_retained: int = 10_000
    store_active: int = 100
    store_restarts: int = 4
    sections: tuple[str, ...] = MP_SECTIONS


QUICK_MULTI = MultiPlan(
    rounds=2,
    groups=24,
    warmup_groups=4,
    single_groups=300,
    sat_levels=(16, 64),
    sat_rounds=1,
    sat_warmup_s=0.5,
    sat_window_s=1.0,
    retained=(100, 2_000),
    retained_rounds=2,
    retained_groups=16,
    profile_s=1.5,
    store_retained=2_000,
    store_restarts=2,
)


# ----------------------------------------------------------------------------- measuring
@dataclass(slots=True)
class Run:
    side: str
    api: str
    round: int
    members_per_s: float
    member_p50_ms: float
    member_p99_ms: float
    member_max_ms: float
    group_p99_ms: float
    members: int
    errors: int
    masked: int
    elapsed_s: float
    server_cpu_s: float
    judge_calls: int
    judge_max_in_flight: int
    cpu_us_per_member: float = math.nan
    cpu_us_per_judge_call: float = math.nan
    latencies_ms: list[float] = field(default_factory=list)


def timed(load: LoadGen, target: Proc, judge: Judge | None, side: str, rnd: int, **cmd: Any) -> Run:
    if judge is not None:
        judge.reset()
    cpu0 = target.cpu()
    out = load.run(target=target.target, **cmd)
    cpu = target.cpu() - cpu0
    stats = judge.stats() if judge is not None else {"requests": 0, "max_in_flight": 0}
    if out["errors"]:
        raise RuntimeError(
            f"{side} {cmd['api']}: {out['errors']} errors, e.g. {out['first_error']}"
        )
    run = Run(
        side=side,
        api=cmd["api"],
        round=rnd,
        members_per_s=out["members_per_s"],
        member_p50_ms=out["member_p50_ms"],
        member_p99_ms=out["member_p99_ms"],
        member_max_ms=out["member_max_ms"],
        group_p99_ms=out["group_p99_ms"],
        members=out["members"],
        errors=out["errors"],
        masked=out["masked"],
        elapsed_s=out["elapsed_s"],
        server_cpu_s=cpu,
        judge_calls=int(stats["requests"]),
        judge_max_in_flight=int(stats["max_in_flight"]),
        latencies_ms=out.get("latencies_ms", []),
    )
    run.cpu_us_per_member = cpu / run.members * 1e6 if run.members else math.nan
    run.cpu_us_per_judge_call = cpu / run.judge_calls * 1e6 if run.judge_calls else math.nan
    return run


def spread(values: Sequence[float]) -> dict[str, Any]:
    vals = [v for v in values if not math.isnan(v)]
    return {
        "median": statistics.median(vals) if vals else math.nan,
        "min": min(vals, default=math.nan),
        "max": max(vals, default=math.nan),
        "rounds": list(values),
    }


def abab(
    plan: MultiPlan,
    load: LoadGen,
    sides: dict[str, Proc],
    judge: Judge | None,
    *,
    apis: Sequence[str],
    rounds: int,
    **cmd: Any,
) -> dict[str, Any]:
    """Every side per API and round, the order reversed every other round; the ratios
    of each side's throughput to the last side's (``ratios``), ``ratio`` the first's."""
    names = list(sides)
    runs: list[Run] = []
    for rnd in range(rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for api in apis:
            for name in order:
                prefix = f"{name}-{api}-r{rnd}"
                runs.append(
                    timed(load, sides[name], judge, name, rnd, api=api, prefix=prefix, **cmd)
                )
                last = runs[-1]
                print(
                    f"   {name:>9} {api:>12} round {rnd + 1}: {last.members_per_s:,.0f} "
                    f"members/s, p99 {last.member_p99_ms:.1f} ms, "
                    f"server CPU {last.cpu_us_per_member:.0f} µs/member",
                    flush=True,
                )
    *others, ref = names
    summary: dict[str, Any] = {}
    for api in apis:
        per = {n: [r for r in runs if r.api == api and r.side == n] for n in names}
        ratios = {
            n: spread(
                [
                    ra.members_per_s / rb.members_per_s
                    for ra, rb in zip(per[n], per[ref], strict=True)
                ]
            )
            for n in others
        }
        summary[api] = {
            "ratio": ratios[others[0]],
            "ratios": ratios,
            **{
                n: {
                    "members_per_s": spread([r.members_per_s for r in per[n]]),
                    "cpu_us_per_member": spread([r.cpu_us_per_member for r in per[n]]),
                    "cpu_us_per_judge_call": spread([r.cpu_us_per_judge_call for r in per[n]]),
                    "member_p50_ms": spread([r.member_p50_ms for r in per[n]]),
                    "member_p99_ms": spread([r.member_p99_ms for r in per[n]]),
                    "judge_calls_per_member": spread(
                        [r.judge_calls / r.members if r.members else math.nan for r in per[n]]
                    ),
                    "judge_max_in_flight": max(r.judge_max_in_flight for r in per[n]),
                    "masked": sum(r.masked for r in per[n]),
                }
                for n in names
            },
        }
    return {"sides": names, "summary": summary, "runs": [slim(r) for r in runs]}


def slim(run: Run) -> dict[str, Any]:
    d = asdict(run)
    d.pop("latencies_ms")
    return d


def warm(load: LoadGen, target: Proc, size: int, groups: int, in_flight: int) -> None:
    for api in APIS:
        load.run(
            target=target.target,
            api=api,
            prefix=f"warm-{api}",
            size=size,
            groups=groups,
            in_flight=in_flight,
        )


# ----------------------------------------------------------------------------- sections
def same_bodies(
    load: LoadGen, judge: Judge, service: Proc, baseline: Proc, size: int
) -> dict[str, Any]:
    """Record the judge bodies of one identical group sent to each side; compare them."""
    got: dict[str, list[str]] = {}
    for name, target in (("service", service), ("baseline", baseline)):
        judge.record(4 * size)
        load.run(
            target=target.target,
            api="SubmitMember",
            prefix="same-bodies",
            size=size,
            groups=1,
            in_flight=1,
        )
        got[name] = sorted(json.dumps(b, sort_keys=True) for b in judge.bodies())
    return {
        "identical": got["service"] == got["baseline"],
        "service_requests": len(got["service"]),
        "baseline_requests": len(got["baseline"]),
        "body_bytes": [len(b) for b in got["service"][:1]],
    }


def section_throughput(
    plan: MultiPlan, load: LoadGen, judge: Judge, logs: pathlib.Path
) -> dict[str, Any]:
    service = start_service(
        "service",
        judge,
        logs,
        concurrency=plan.concurrency,
        num_rollouts_per_prompt=plan.group_size,
    )
    base = start_baseline("baseline", "judge", judge, logs, concurrency=plan.concurrency)
    try:
        bodies = same_bodies(load, judge, service, base, plan.group_size)
        print(f"   judge bodies service vs baseline identical: {bodies['identical']}", flush=True)
        for p in (service, base):
            warm(load, p, plan.group_size, plan.warmup_groups, plan.in_flight)
        out = abab(
            plan,
            load,
            {"service": service, "baseline": base},
            judge,
            apis=APIS,
            rounds=plan.rounds,
            size=plan.group_size,
            groups=plan.groups,
            in_flight=plan.in_flight,
            answer_bytes=plan.answer_bytes,
        )
    finally:
        service.stop()
        base.stop()
    out["bodies"] = bodies
    return out


def section_single(
    plan: MultiPlan, load: LoadGen, judge: Judge, logs: pathlib.Path
) -> dict[str, Any]:
    """Three sides in the same rounds: the service on ``memory://`` (``service``), the
    same on the default store, a fresh SQLite file (``service-sqlite``), and the echo."""
    service = start_service("service-single", judge, logs, concurrency=plan.concurrency)
    url = fresh_store(logs, "single-sqlite")
    on_file = start_service(
        "service-single-sqlite", judge, logs, concurrency=plan.concurrency, store=url
    )
    echo = start_baseline("echo", "echo", judge, logs, concurrency=plan.concurrency)
    try:
        for p in (service, on_file, echo):
            warm(load, p, 1, plan.warmup_groups * 8, plan.single_in_flight)
        out = abab(
            plan,
            load,
            {"service": service, "service-sqlite": on_file, "echo": echo},
            judge,
            apis=APIS,
            rounds=plan.rounds,
            size=1,
            groups=plan.single_groups,
            in_flight=plan.single_in_flight,
            answer_bytes=plan.answer_bytes,
        )
    finally:
        service.stop()
        on_file.stop()
        echo.stop()
    out["served_file"] = store_file_figures(_store_file(url))
    return out


def saturation_run(
    plan: MultiPlan, load: LoadGen, judge: Judge, target: Proc, side: str, c: int, rnd: int
) -> dict[str, Any]:
    # Three times C pairs offered: a group's pairs start together and its members are
    # answered when its slowest pair is back, so the queue must not run dry between groups.
    in_flight = max(4, math.ceil(3 * c / plan.group_size))
    judge.reset()
    load.send(
        target=target.target,
        api="SubmitMember",
        prefix=f"sat-{side}-{c}-r{rnd}",
        size=plan.group_size,
        in_flight=in_flight,
        answer_bytes=plan.answer_bytes,
        duration_s=plan.sat_warmup_s + plan.sat_window_s,
    )
    time.sleep(plan.sat_warmup_s)
    t0, s0, cpu0 = time.perf_counter(), judge.stats(), target.cpu()
    time.sleep(plan.sat_window_s)
    t1, s1, cpu1 = time.perf_counter(), judge.stats(), target.cpu()
    out = load.result()
    stats = judge.stats()
    if out["errors"]:
        raise RuntimeError(f"saturation {side} C={c}: {out['first_error']}")
    calls = s1["requests"] - s0["requests"]
    per_s = calls / (t1 - t0)
    ideal = c / (plan.sat_latency_ms / 1e3)
    return {
        "side": side,
        "c": c,
        "round": rnd,
        "groups_in_flight": in_flight,
        "pairs_per_s": per_s,
        "ideal_per_s": ideal,
        "saturation": per_s / ideal,
        "max_in_flight": int(stats["max_in_flight"]),
        "cpu_us_per_judge_call": (cpu1 - cpu0) / calls * 1e6 if calls else math.nan,
        "server_cpu_share": (cpu1 - cpu0) / (t1 - t0),
        "masked": out["masked"],
    }


def section_saturation(plan: MultiPlan, load: LoadGen, logs: pathlib.Path) -> dict[str, Any]:
    judge = Judge("judge-100ms", plan.sat_latency_ms, logs)
    rows: list[dict[str, Any]] = []
    try:
        for c in plan.sat_levels:
            service = start_service(
                f"service-c{c}", judge, logs, concurrency=c, num_rollouts_per_prompt=plan.group_size
            )
            base = start_baseline(f"baseline-c{c}", "judge", judge, logs, concurrency=c)
            try:
                for p in (service, base):
                    load.run(
                        target=p.target,
                        api="SubmitMember",
                        prefix="warm",
                        size=plan.group_size,
                        groups=4,
                        in_flight=4,
                        answer_bytes=plan.answer_bytes,
                    )
                sides = (("service", service), ("baseline", base))
                for rnd in range(plan.sat_rounds):
                    for side, proc in sides if rnd % 2 == 0 else sides[::-1]:
                        row = saturation_run(plan, load, judge, proc, side, c, rnd)
                        rows.append(row)
                        print(
                            f"   C={c:>3} {side:>8} round {rnd + 1}: {row['pairs_per_s']:,.0f} "
                            f"calls/s = {row['saturation']:.2f}× C/L, max in flight "
                            f"{row['max_in_flight']}, server CPU {row['cpu_us_per_judge_call']:.0f}"
                            " µs/call",
                            flush=True,
                        )
            finally:
                service.stop()
                base.stop()
    finally:
        judge.stop()
    summary = {}
    for c in plan.sat_levels:
        for side in ("service", "baseline"):
            mine = [r for r in rows if r["c"] == c and r["side"] == side]
            summary[f"{side}-{c}"] = {
                "saturation": spread([r["saturation"] for r in mine]),
                "pairs_per_s": spread([r["pairs_per_s"] for r in mine]),
                "max_in_flight": max(r["max_in_flight"] for r in mine),
                "cpu_us_per_judge_call": spread([r["cpu_us_per_judge_call"] for r in mine]),
            }
    return {
        "latency_ms": plan.sat_latency_ms,
        "levels": list(plan.sat_levels),
        "rows": rows,
        "summary": summary,
    }


def section_retained(
    plan: MultiPlan, load: LoadGen, judge: Judge, logs: pathlib.Path
) -> dict[str, Any]:
    servers: dict[str, Proc] = {}
    fill: dict[str, float] = {}
    try:
        for n in plan.retained:
            name = f"retained-{n}"
            servers[name] = start_service(
                name,
                judge,
                logs,
                concurrency=plan.concurrency,
                num_rollouts_per_prompt=plan.group_size,
                max_terminal_cohorts=n,
                cohort_result_ttl_s=1e7,
            )
            t0 = time.perf_counter()
            load.run(
                target=servers[name].target,
                api="StreamGroups",
                prefix="fill",
                size=1,
                groups=n,
                in_flight=256,
                answer_bytes=64,
            )
            fill[name] = time.perf_counter() - t0
            print(f"   {name}: prefilled {n:,} cohorts in {fill[name]:.1f} s", flush=True)
        for p in servers.values():
            warm(load, p, plan.group_size, plan.warmup_groups, plan.in_flight)
        runs: list[Run] = []
        names = list(servers)
        for rnd in range(plan.retained_rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                run = timed(
                    load,
                    servers[name],
                    judge,
                    name,
                    rnd,
                    api="SubmitMember",
                    prefix=f"ret-r{rnd}",
                    size=plan.group_size,
                    groups=plan.retained_groups,
                    in_flight=plan.retained_in_flight,
                    answer_bytes=plan.answer_bytes,
                    keep_latencies=True,
                )
                runs.append(run)
                print(
                    f"   {name:>16} round {rnd + 1}: member p99 {run.member_p99_ms:.1f} ms, "
                    f"max {run.member_max_ms:.1f} ms",
                    flush=True,
                )
    finally:
        for p in servers.values():
            p.stop()
    lo, hi = names[0], names[-1]
    per = {n: [r for r in runs if r.side == n] for n in names}
    ratios = [b.member_p99_ms / a.member_p99_ms for a, b in zip(per[lo], per[hi], strict=True)]

    def pooled(n: str, q: float) -> float:
        from bench.util import percentile

        return percentile([x for r in per[n] for x in r.latencies_ms], q)

    return {
        "retained": list(plan.retained),
        "prefill_s": fill,
        "ratio_p99": spread(ratios),
        "pooled_ratio_p99": pooled(hi, 0.99) / pooled(lo, 0.99),
        "per_side": {
            n: {
                "member_p50_ms": spread([r.member_p50_ms for r in per[n]]),
                "member_p99_ms": spread([r.member_p99_ms for r in per[n]]),
                "member_max_ms": spread([r.member_max_ms for r in per[n]]),
                "pooled_p99_ms": pooled(n, 0.99),
                "members_per_s": spread([r.members_per_s for r in per[n]]),
                "cpu_us_per_member": spread([r.cpu_us_per_member for r in per[n]]),
            }
            for n in names
        },
        "runs": [slim(r) for r in runs],
        "latencies_ms": {n: [x for r in per[n] for x in r.latencies_ms] for n in names},
    }


def _store_file(url: str) -> pathlib.Path:
    return pathlib.Path(url.removeprefix("sqlite:///"))


def store_file_figures(path: pathlib.Path) -> dict[str, Any]:
    """Size of a closed store file and what it holds (read with a second connection)."""
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        count = {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("cohorts", "members", "tombstones", "watermarks", "verdicts")
        }
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    files = sum(
        p.stat().st_size
        for p in (path.parent / f"{path.name}{x}" for x in ("", "-wal"))
        if p.exists()
    )
    return {
        "rows": count,
        "file_bytes": files,
        "used_bytes": (pages - free) * page,
        "used_bytes_per_tombstone": (pages - free) * page / max(count["tombstones"], 1),
    }


def timed_restart(
    name: str, judge: Judge, logs: pathlib.Path, store: pathlib.Path, retained: int
) -> dict[str, Any]:
    """Start ``genrm-grpc serve`` on ``store``: seconds from exec to "serving on" and to
    the first answered GetCohort (of ``active-0``, a cohort the file may hold)."""
    import grpc
    from genrm.cohort.v1 import cohort_pb2 as pb
    from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

    server = start_service(
        name,
        judge,
        logs,
        concurrency=64,
        store=f"sqlite:///{store.resolve()}",
        max_terminal_cohorts=max(retained, 4096),
        cohort_result_ttl_s=1e7,
    )
    try:
        with grpc.insecure_channel(server.target) as channel:
            try:
                reply = pb_grpc.CohortServiceStub(channel).GetCohort(
                    pb.GetCohortRequest(member=pb.MemberRef(group_id="active-0")),
                    timeout=60,
                    wait_for_ready=True,
                )
                answer = pb.CohortPhase.Name(reply.cohort.phase)
                members = len(reply.cohort.present_indices)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # an empty store's answer
                    raise
                answer, members = "NOT_FOUND", 0
            first = time.perf_counter() - server.started
    finally:
        server.stop()
    return {
        "serving_s": server.ready_s,
        "first_get_cohort_s": first,
        "answer": answer,
        "members": members,
    }


def store_recovery(plan: MultiPlan, judge: Judge, logs: pathlib.Path) -> dict[str, Any]:
    """Restart time on a full store file vs an empty one, ABAB; bytes per retained cohort."""
    from bench.store import build

    full, empty, tombs = (logs / f"recovery-{k}.sqlite3" for k in ("full", "empty", "tombs"))
    for path in (full, empty, tombs):
        for old in path.parent.glob(f"{path.name}*"):
            old.unlink()
    t0 = time.perf_counter()
    build(full, plan.store_retained, plan.store_active, time.time())
    build(empty, 0, 0, time.time())
    build(tombs, plan.store_retained, 0, time.time())
    built_s = time.perf_counter() - t0
    size = store_file_figures(tombs)
    rows: list[dict[str, Any]] = []
    sides = (("full", full), ("empty", empty))
    for rnd in range(plan.store_restarts):
        for side, path in sides if rnd % 2 == 0 else sides[::-1]:
            row = timed_restart(f"restart-{side}", judge, logs, path, plan.store_retained)
            rows.append({"side": side, "round": rnd, **row})
            print(
                f"   restart {side:>5} round {rnd + 1}: serving after {row['serving_s']:.2f} s, "
                f"first GetCohort after {row['first_get_cohort_s']:.2f} s ({row['answer']}, "
                f"{row['members']} members)",
                flush=True,
            )
    return {
        "retained": plan.store_retained,
        "active": plan.store_active,
        "build_s": built_s,
        "restarts": rows,
        "summary": {
            side: {
                key: spread([r[key] for r in rows if r["side"] == side])
                for key in ("serving_s", "first_get_cohort_s")
            }
            for side, _ in sides
        },
        "size": {
            **size,
            "retained_file_bytes": size["file_bytes"],
            "bytes_per_retained_cohort": size["file_bytes"] / max(plan.store_retained, 1),
        },
    }


def section_store(
    plan: MultiPlan, load: LoadGen, judge: Judge, logs: pathlib.Path
) -> dict[str, Any]:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = list(os.getloadavg())
    sqlite_url = fresh_store(logs, "store-sqlite")
    servers = {
        name: start_service(
            f"store-{name}",
            judge,
            logs,
            concurrency=plan.concurrency,
            store=url,
            num_rollouts_per_prompt=plan.group_size,
        )
        for name, url in (("sqlite", sqlite_url), ("memory", "memory://"))
    }
    try:
        for p in servers.values():
            warm(load, p, plan.group_size, plan.warmup_groups, plan.in_flight)
        out = abab(
            plan,
            load,
            servers,
            judge,
            apis=APIS,
            rounds=plan.rounds,
            size=plan.group_size,
            groups=plan.groups,
            in_flight=plan.in_flight,
            answer_bytes=plan.answer_bytes,
        )
    finally:
        for p in servers.values():
            p.stop()
    out["served_file"] = store_file_figures(_store_file(sqlite_url))
    out["recovery"] = store_recovery(plan, judge, logs)
    out["started_at"] = started_at
    out["loadavg"] = [load0, list(os.getloadavg())]
    return out


def _frame(frame: str) -> str:
    """``func (.../site-packages/httpx/_client.py:123)`` → ``func (httpx/_client.py)``:
    one entry per function; the project's own files keep their ``genrm_grpc/`` prefix."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    if "genrm_grpc/" in where:
        where = "genrm_grpc/" + where.split("genrm_grpc/", 1)[1]
    else:
        for root in ("site-packages/", "python3.11/"):
            if root in where:
                where = where.split(root, 1)[1]
    return f"{name} ({where})" if where else name


#: Libraries of the judge HTTP client path (httpx today; aiohttp is counted too).
_HTTP_CLIENT = ("httpx/", "httpcore/", "anyio/", "h11/", "aiohttp/", "tenacity/")


#: The modules of the judge HTTP client (``judge/client.py`` and the parts it is split
#: into): a hedged request runs in a task of its own, whose stack holds no client.py frame.
_JUDGE_CLIENT = tuple(
    f"(genrm_grpc/judge/{name}.py"
    for name in ("client", "transport", "wire", "attempts", "checks", "texts", "sse")
)


def _category(frames: Sequence[str]) -> str:
    if any(
        any(module in f for module in _JUDGE_CLIENT)
        or f.partition(" (")[2].startswith(_HTTP_CLIENT)
        for f in frames
    ):
        return "judge HTTP client (genrm_grpc/judge/client.py and its HTTP library)"
    if any("(genrm_grpc/" in f and "genrm_grpc/cli.py" not in f for f in frames):
        return "service code (servicer, registry, runtime, scoring, metrics)"
    return "gRPC core and the event loop only (no project frame on the stack)"


def summarise_profile(raw: str, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks, the
    top project functions, the share of samples per category of work and, when the stacks
    begin with py-spy's thread frame (``--threads``), per thread."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    cats: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[tuple[int, str]] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        raw_frames = stack.split(";")
        thread = _THREAD_FRAME.match(raw_frames[0])
        if thread is not None:
            threads[(int(thread.group(1)), thread.group(2))] += n
            raw_frames = raw_frames[1:]
        total += n
        frames = [_frame(f) for f in raw_frames]
        cats[_category(frames)] += n
        if not frames:  # the thread held the GIL outside any Python frame
            continue
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n

    def share(counts: collections.Counter[str], keep: int = top) -> list[list[Any]]:
        return [[f, round(100 * k / total, 1)] for f, k in counts.most_common(keep)]

    project = collections.Counter(
        {f: k for f, k in incl.items() if "(genrm_grpc/" in f and "genrm_grpc/cli.py" not in f}
    )
    return {
        "samples": total,
        "self": share(own),
        "inclusive": share(incl),
        "project": share(project),
        "categories": share(cats, 10),
        "threads": [[tid, name, round(100 * k / total, 1)] for (tid, name), k in threads.items()],
    }


#: py-spy's first frame of a stack under ``--threads``: ``thread (TID): NAME``.
_THREAD_FRAME = re.compile(r"thread \((\d+)\): (.*)")


#: A thread in ``py-spy dump``'s output: ``Thread TID (idle): "NAME"``.
_DUMPED_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "(.*)"$', re.MULTILINE)


def python_threads(spy: str, pid: int) -> dict[int, str]:
    """The Python name of each Python thread of a process, by thread id (``py-spy
    dump``); empty when the dump fails."""
    try:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(pid), "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {}
    return {int(tid): name for tid, name in _DUMPED_THREAD.findall(dump.stdout)}


def thread_rows(
    pid: int,
    before: dict[int, tuple[str, float, float]],
    after: dict[int, tuple[str, float, float]],
    spied: Sequence[Sequence[Any]],
    members: int,
    python_names: dict[int, str],
) -> list[dict[str, Any]]:
    """CPU per member of each kind of thread of the server in one profiled run, with its
    share of the GIL samples. A Python thread has its Python name, any other the kernel's
    (``comm``: gRPC core's threads name themselves); threads of one name are summed
    (gRPC's event-engine pool). The main thread is the event loop."""
    names = {**python_names, **{int(tid): str(name) for tid, name, _ in spied}}
    gil = {int(tid): float(pct) for tid, _, pct in spied}
    rows: dict[str, dict[str, Any]] = {}
    for tid, (comm, user, system) in after.items():
        _, user0, system0 = before.get(tid, (comm, 0.0, 0.0))
        name = names.get(tid, comm)
        if tid == pid:
            name = f"{name} (the event loop)"
        row = rows.setdefault(
            name, {"thread": name, "threads": 0, "user_us": 0.0, "system_us": 0.0, "gil_pct": 0.0}
        )
        row["threads"] += 1
        row["user_us"] += (user - user0) / members * 1e6 if members else math.nan
        row["system_us"] += (system - system0) / members * 1e6 if members else math.nan
        row["gil_pct"] += gil.get(tid, 0.0)
    kept = [r for r in rows.values() if r["user_us"] + r["system_us"] > 0 or r["gil_pct"] > 0]
    return sorted(kept, key=lambda r: -(r["user_us"] + r["system_us"]))


def find_py_spy() -> str | None:
    """py-spy from this interpreter's environment (the bench extra), else from PATH."""
    here = pathlib.Path(sys.executable).parent
    return shutil.which("py-spy", path=str(here)) or shutil.which("py-spy")


def profiled(
    spy: str,
    plan: MultiPlan,
    load: LoadGen,
    service: Proc,
    path: pathlib.Path,
    *,
    api: str,
    size: int,
    in_flight: int,
) -> dict[str, Any]:
    """One py-spy recording (``--gil --threads``) of ``service`` under load, with the
    server's CPU per member, whole and per thread, over the same run."""
    spy_proc = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(service.pid),
            "--duration",
            str(math.ceil(plan.profile_s) + 1),
            "--rate",
            "250",
            "--gil",
            "--threads",
            "--format",
            "raw",
            "--nonblocking",
            "-o",
            str(path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    cpu0, threads0 = service.cpu(), service.threads()
    res = load.run(
        target=service.target,
        api=api,
        prefix=f"prof-{path.stem}",
        size=size,
        in_flight=in_flight,
        duration_s=plan.profile_s,
        answer_bytes=plan.answer_bytes,
    )
    cpu, threads1 = service.cpu() - cpu0, service.threads()
    _, err = spy_proc.communicate(timeout=60)
    if spy_proc.returncode != 0 or not path.exists():
        return {"error": (err or "")[-500:]}
    summary = summarise_profile(path.read_text())
    members = int(res["members"])
    summary["cpu_us_per_member"] = cpu / members * 1e6 if members else math.nan
    summary["members_per_s"] = res["members_per_s"]
    summary["by_thread"] = thread_rows(
        service.pid,
        threads0,
        threads1,
        summary["threads"],
        members,
        python_threads(spy, service.pid),
    )
    summary.update(api=api, group_size=size, in_flight=in_flight)
    return summary


def section_profile(
    plan: MultiPlan, load: LoadGen, judge: Judge, logs: pathlib.Path
) -> dict[str, Any]:
    """The service on ``memory://`` for both APIs (1-member groups) and the judge-call
    path (16-member groups), then a server on the default store (a fresh SQLite file) for
    SubmitMember with 1- and 16-member groups: where the SQLite figures of §2 and §11 go,
    the writer thread included."""
    spy = find_py_spy()
    if spy is None:
        return {"error": "py-spy not installed"}
    out: dict[str, Any] = {}
    one = plan.single_in_flight
    cases = {
        "memory": [
            *((api, api, 1, one) for api in APIS),
            ("judge", "SubmitMember", plan.group_size, plan.in_flight),
        ],
        "sqlite": [
            ("sqlite", "SubmitMember", 1, one),
            ("sqlite-judge", "SubmitMember", plan.group_size, plan.in_flight),
        ],
    }
    for store, runs in cases.items():
        service = start_service(
            f"service-profile-{store}",
            judge,
            logs,
            concurrency=plan.concurrency,
            store=fresh_store(logs, "profile-sqlite") if store == "sqlite" else None,
            num_rollouts_per_prompt=plan.group_size,
        )
        try:
            warm(load, service, 1, plan.warmup_groups * 8, plan.single_in_flight)
            for label, api, size, in_flight in runs:
                summary = profiled(
                    spy,
                    plan,
                    load,
                    service,
                    logs / f"profile-{label}.txt",
                    api=api,
                    size=size,
                    in_flight=in_flight,
                )
                out[label] = summary
                if "error" in summary:
                    continue
                print(
                    f"   profile {label}: {summary['samples']} samples; top self: "
                    + ", ".join(f"{f} {p}%" for f, p in summary["self"][:4]),
                    flush=True,
                )
        finally:
            service.stop()
    return out


def run_multi(plan: MultiPlan, out: dict[str, Any], keep_logs: pathlib.Path | None = None) -> None:
    """Run the multi-process sections of ``plan`` and put their results into ``out``."""
    logs = keep_logs or pathlib.Path(tempfile.mkdtemp(prefix="genrm-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    judge = Judge("judge-instant", 0.0, logs)
    load = LoadGen(logs)
    try:
        if "throughput" in plan.sections:
            print(
                "multi-process: service vs echo-plus-judge baseline (16-member groups)", flush=True
            )
            out["throughput"] = section_throughput(plan, load, judge, logs)
        if "single" in plan.sections:
            print("multi-process: 1-member groups vs bare echo", flush=True)
            out["single"] = section_single(plan, load, judge, logs)
        if "saturation" in plan.sections:
            print("multi-process: judge saturation", flush=True)
            out["saturation"] = section_saturation(plan, load, logs)
        if "retained" in plan.sections:
            print("multi-process: p99 vs retained cohorts", flush=True)
            out["retained"] = section_retained(plan, load, judge, logs)
        if "profile" in plan.sections:
            print("multi-process: py-spy profiles, 1-member groups", flush=True)
            out["profile"] = section_profile(plan, load, judge, logs)
        if "store" in plan.sections:
            print("multi-process: SQLite store vs memory://, restart recovery", flush=True)
            out["store"] = section_store(plan, load, judge, logs)
        if "replicas" in plan.sections:
            from bench.replicas import section_replicas  # imports this module

            print("multi-process: replicas on a shared Redis vs memory://", flush=True)
            out["replicas"] = section_replicas(plan, load, judge, logs)
    finally:
        load.stop()
        judge.stop()
        if keep_logs is None:
            shutil.rmtree(logs, ignore_errors=True)
