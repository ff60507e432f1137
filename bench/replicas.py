"""§12 of ``make bench``: replicas sharing one Redis against one replica in memory.

Three variants of the same deployment, each a set of real processes next to the
section's judge and load generator:

- ``memory``   one ``genrm-grpc serve`` on ``memory://`` (nothing shared);
- ``redis-1``  one ``genrm-grpc serve`` on ``redis://`` (a redis-server of its own);
- ``redis-3``  three ``genrm-grpc serve`` on one other ``redis://``, the load generator
               sending member ``i`` of every group to replica ``i % 3``.

Both redis-servers are started by the harness (``RedisServer(appendonly=True)``: AOF
with ``appendfsync always``, the setting docs/scaling.md recommends). Every variant gets
the same groups (16 members, 2 KiB answers, the instant judge), both APIs, rounds in
rotating order (ABC, CBA, …), the median and spread of the rounds.

What is counted in Redis, from Redis itself (one ``INFO all`` before and after each
run; the harness's own ``INFO`` is taken off):

- **commands**: ``total_commands_processed``: every command Redis executed, those a
  client sent and those a script ran with ``redis.call`` (an ``EVALSHA`` whose script
  makes 10 calls is 11 commands);
- **scripts**: ``EVALSHA`` + ``EVAL`` calls (group reads, group commits, lease claims
  and renewals, journal batches);
- **round trips**: ``total_writes_processed`` (replies Redis wrote to its clients:
  Redis answers a request, or all the commands of a pipeline that arrived together,
  with one write) minus the messages it pushed to the replicas' subscriptions (each
  ``PUBLISH`` × the subscribers counted before the run: an upper bound, since pushes
  in one turn of Redis's event loop share a write, which can make this a slight
  undercount);
- **socket reads** (``total_reads_processed``) as a cross-check: one per request too,
  but a request larger than 16 KiB (a commit carrying many members' texts) takes
  several, so it is an upper bound.

Sweeps and health pings of idle replicas run during a measurement too and are in the
figures: they cost per second, not per member.
"""

from __future__ import annotations

import math
import os
import pathlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from bench.launch import Judge, LoadGen, Proc, cpu_seconds, start_replicas
from bench.mpreport import HEADERS, _spread
from bench.multiproc import APIS, MultiPlan, spread
from bench.util import mark, md_table, num
from genrm_grpc.testing.redis_server import RedisServer

SIDES = ("memory", "redis-1", "redis-3")
REPLICAS = {"memory": 1, "redis-1": 1, "redis-3": 3}
#: The replicas' channel for ended cohorts (``genrm_grpc.store.shared``, default prefix).
CHANNEL = "genrm:ended"
TARGET = 0.5
#: Figures per member read from Redis for a run.
REDIS_FIGURES = ("commands", "round_trips", "scripts", "reads", "pushes")


# ----------------------------------------------------------------------------- counting
def redis_counters(client: redis.Redis) -> dict[str, Any]:
    """One ``INFO all``: the totals this section counts and the calls per command."""
    info = client.info("all")
    return {
        "commands": int(info["total_commands_processed"]),
        "writes": int(info["total_writes_processed"]),
        "reads": int(info["total_reads_processed"]),
        "calls": {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in info.items()
            if name.startswith("cmdstat_")
        },
    }


def redis_delta(before: dict[str, Any], after: dict[str, Any], subscribers: int) -> dict[str, Any]:
    """What Redis did between two ``redis_counters`` snapshots, the second snapshot's own
    ``INFO`` excluded (``after`` sees the first one's command, write and the second
    one's read)."""
    calls = {
        name: after["calls"][name] - before["calls"].get(name, 0)
        for name in after["calls"]
        if name != "info" and after["calls"][name] != before["calls"].get(name, 0)
    }
    pushes = calls.get("publish", 0) * subscribers
    return {
        "commands": after["commands"] - before["commands"] - 1,
        "round_trips": after["writes"] - before["writes"] - 1 - pushes,
        "scripts": calls.get("evalsha", 0) + calls.get("eval", 0),
        "reads": after["reads"] - before["reads"] - 1,
        "pushes": pushes,
        "calls": calls,
    }


# ----------------------------------------------------------------------------- variants
@dataclass
class Variant:
    """One deployment under test: its servers and, for a Redis one, its redis-server."""

    name: str
    servers: list[Proc]
    redis_server: RedisServer | None = None
    client: redis.Redis | None = None
    subscribers: int = 0

    @property
    def targets(self) -> list[str]:
        return [p.target for p in self.servers]

    def cpu(self) -> float:
        return sum(p.cpu() for p in self.servers)

    def redis_cpu(self) -> float:
        if self.redis_server is None or self.redis_server.proc is None:
            return math.nan
        return cpu_seconds(self.redis_server.proc.pid)

    def counters(self) -> dict[str, Any] | None:
        return redis_counters(self.client) if self.client is not None else None

    def stop(self) -> None:
        for p in self.servers:
            p.stop()
        if self.client is not None:
            self.client.close()
        if self.redis_server is not None:
            self.redis_server.close()


def start_variant(name: str, plan: MultiPlan, judge: Judge, logs: pathlib.Path) -> Variant:
    server = RedisServer(appendonly=True).start() if name != "memory" else None
    variant = Variant(name, [], server)
    try:
        variant.servers = start_replicas(
            f"replicas-{name}",
            REPLICAS[name],
            judge,
            logs,
            concurrency=plan.concurrency,
            store=server.url if server is not None else "memory://",
            num_rollouts_per_prompt=plan.group_size,
        )
        if server is not None:
            variant.client = redis.Redis(host="127.0.0.1", port=server.port)
    except BaseException:
        variant.stop()
        raise
    return variant


def _subscribers(client: redis.Redis) -> int:
    found = dict(client.pubsub_numsub(CHANNEL))
    return int(found.get(CHANNEL.encode(), found.get(CHANNEL, 0)))


def warm_variant(load: LoadGen, v: Variant, plan: MultiPlan) -> None:
    for api in APIS:
        load.run(
            targets=v.targets,
            api=api,
            prefix=f"warm-{v.name}-{api}",
            size=plan.group_size,
            groups=plan.warmup_groups,
            in_flight=plan.in_flight,
            answer_bytes=plan.answer_bytes,
        )
    if v.client is not None:
        # Each replica subscribes to the channel from a task of its own: wait until all
        # have (Redis's own count), so that pushes per PUBLISH = replicas.
        deadline = time.monotonic() + 30
        while (found := _subscribers(v.client)) < len(v.servers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{v.name}: {found} of {len(v.servers)} replicas subscribed")
            time.sleep(0.01)  # polling Redis's count: there is no event to wait on
        v.subscribers = found


def timed_variant(
    load: LoadGen, v: Variant, judge: Judge, api: str, rnd: int, plan: MultiPlan
) -> dict[str, Any]:
    judge.reset()
    before = v.counters()
    cpu0, rcpu0 = v.cpu(), v.redis_cpu()
    out = load.run(
        targets=v.targets,
        api=api,
        prefix=f"rep-{v.name}-{api}-r{rnd}",
        size=plan.group_size,
        groups=plan.groups,
        in_flight=plan.in_flight,
        answer_bytes=plan.answer_bytes,
    )
    cpu, rcpu = v.cpu() - cpu0, v.redis_cpu() - rcpu0
    after = v.counters()
    stats = judge.stats()
    if out["errors"]:
        raise RuntimeError(f"replicas {v.name} {api}: {out['errors']} errors, {out['first_error']}")
    members = out["members"]
    row: dict[str, Any] = {
        "side": v.name,
        "api": api,
        "round": rnd,
        "replicas": len(v.servers),
        "subscribers": v.subscribers,
        "members": members,
        "masked": out["masked"],
        "elapsed_s": out["elapsed_s"],
        "members_per_s": out["members_per_s"],
        "member_p50_ms": out["member_p50_ms"],
        "member_p99_ms": out["member_p99_ms"],
        "server_cpu_s": cpu,
        "cpu_us_per_member": cpu / members * 1e6 if members else math.nan,
        "redis_cpu_us_per_member": rcpu / members * 1e6 if members else math.nan,
        "judge_calls_per_member": int(stats["requests"]) / members if members else math.nan,
    }
    if before is not None and after is not None:
        delta = redis_delta(before, after, v.subscribers)
        row["redis"] = delta
        for figure in REDIS_FIGURES:
            row[f"redis_{figure}_per_member"] = delta[figure] / members if members else math.nan
    return row


def section_replicas(
    plan: MultiPlan, load: LoadGen, judge: Judge, logs: pathlib.Path
) -> dict[str, Any]:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = list(os.getloadavg())
    variants: dict[str, Variant] = {}
    rows: list[dict[str, Any]] = []
    try:
        for name in SIDES:
            variants[name] = start_variant(name, plan, judge, logs)
        for v in variants.values():
            warm_variant(load, v, plan)
        version = ""
        client = variants["redis-1"].client
        if client is not None:
            version = str(client.info("server")["redis_version"])
        for rnd in range(plan.rounds):
            order = SIDES if rnd % 2 == 0 else SIDES[::-1]
            for api in APIS:
                for name in order:
                    row = timed_variant(load, variants[name], judge, api, rnd, plan)
                    rows.append(row)
                    trips = row.get("redis_round_trips_per_member", math.nan)
                    print(
                        f"   {name:>8} {api:>12} round {rnd + 1}: "
                        f"{row['members_per_s']:,.0f} members/s, p99 "
                        f"{row['member_p99_ms']:.1f} ms, server CPU "
                        f"{row['cpu_us_per_member']:.0f} µs/member, Redis "
                        f"{num(trips, 2)} round trips/member",
                        flush=True,
                    )
    finally:
        for v in variants.values():
            v.stop()
    return {
        "sides": list(SIDES),
        "replicas": dict(REPLICAS),
        "redis_version": version,
        "appendfsync": "always",
        "summary": summarise(rows),
        "runs": rows,
        "started_at": started_at,
        "loadavg": [load0, list(os.getloadavg())],
    }


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for api in APIS:
        per = {s: [r for r in rows if r["api"] == api and r["side"] == s] for s in SIDES}
        entry: dict[str, Any] = {}
        for side in ("redis-1", "redis-3"):
            entry[f"ratio_{side}"] = spread(
                [
                    b["members_per_s"] / a["members_per_s"]
                    for a, b in zip(per["memory"], per[side], strict=True)
                ]
            )
        for side, runs in per.items():
            fig: dict[str, Any] = {
                key: spread([r[key] for r in runs])
                for key in (
                    "members_per_s",
                    "cpu_us_per_member",
                    "redis_cpu_us_per_member",
                    "member_p50_ms",
                    "member_p99_ms",
                    "judge_calls_per_member",
                )
            }
            fig["masked"] = sum(r["masked"] for r in runs)
            if runs and "redis" in runs[0]:
                for figure in REDIS_FIGURES:
                    fig[f"redis_{figure}_per_member"] = spread(
                        [r[f"redis_{figure}_per_member"] for r in runs]
                    )
                names = sorted({n for r in runs for n in r["redis"]["calls"]})
                fig["redis_calls_per_member"] = {
                    n: statistics.median(r["redis"]["calls"].get(n, 0) / r["members"] for r in runs)
                    for n in names
                }
            entry[side] = fig
        summary[api] = entry
    return summary


# ----------------------------------------------------------------------------- report
def target_rows(out: dict[str, Any]) -> list[list[str]]:
    rep = out.get("replicas")
    if not rep:
        return []
    rows = []
    for api in APIS:
        r = rep["summary"][api]["ratio_redis-1"]
        trips = rep["summary"][api]["redis-1"]["redis_round_trips_per_member"]["median"]
        ok = r["median"] >= TARGET
        rows.append(
            [
                f"{api}: one replica on Redis ≥ 0.5× the same replica on `memory://` "
                "(16-member groups)",
                _spread(r) + f"; {trips:.2f} Redis round trips/member",
                mark(ok) + ("" if ok else " (§12)"),
            ]
        )
    return rows


def markdown(out: dict[str, Any]) -> str:
    rep = out["replicas"]
    plan = out["multi_plan"]
    summary = rep["summary"]
    load = "; ".join(", ".join(f"{x:.2f}" for x in la) for la in rep["loadavg"])
    lines = [
        "## 12. Replicas on a shared Redis vs one replica in memory (separate processes)",
        "",
        "The same groups sent to three deployments in the same run: **memory** — one "
        "`genrm-grpc serve` on `memory://`; **redis-1** — one on `redis://`; **redis-3** — "
        "three on one `redis://`, the load generator sending member *i* of every group to "
        "replica *i* mod 3 (StreamGroups: one stream per replica and group). Each Redis "
        f"variant has a redis-server {rep['redis_version']} of its own, started by the "
        "harness with AOF and `appendfsync always` (the recommended setting, "
        "docs/scaling.md): Redis fsyncs before it acknowledges. "
        f"Groups of {plan['group_size']} members ({plan['answer_bytes']:,}-byte answers), "
        f"{plan['in_flight']} groups in flight, {plan['groups']} groups per run, "
        f"{plan['rounds']} rounds in rotating order, the instant judge of §1 (one judge "
        "call per member, `circular`).",
        "",
        f"Measured from {rep['started_at']} (load average 1/5/15 min at its start and end: "
        f"{load}).",
        "",
        md_table(
            [*HEADERS[:3], "Redis CPU µs/member", *HEADERS[4:]],
            [
                [
                    f"{api} · {side}",
                    _spread(s["members_per_s"], 0, ""),
                    num(s["cpu_us_per_member"]["median"], 0),
                    num(s["redis_cpu_us_per_member"]["median"], 0),
                    num(s["judge_calls_per_member"]["median"], 2),
                    num(s["member_p50_ms"]["median"]),
                    num(s["member_p99_ms"]["median"]),
                ]
                for api in APIS
                for side in rep["sides"]
                for s in [summary[api][side]]
            ],
        ),
        "",
        "Server CPU is the sum over the variant's replicas. Redis, counted by Redis "
        "itself (`INFO` before and after each run): **commands** = "
        "`total_commands_processed` (those sent by the replicas and those their scripts "
        "ran); **scripts** = `EVALSHA` calls; **round trips** = replies Redis wrote "
        "(`total_writes_processed`: one per request, or per pipeline arriving together) "
        "less the messages pushed to the replicas' subscriptions; socket **reads** "
        "(`total_reads_processed`, several for a request over 16 KiB) as a cross-check; "
        "**group reads** = `HMGET` calls (the group read script runs exactly one).",
        "",
        md_table(
            [
                "API · side",
                "round trips/member",
                "socket reads/member",
                "group reads/member",
                "scripts/member",
                "commands/member",
                "pushes/member",
            ],
            [
                [
                    f"{api} · {side}",
                    _spread(s["redis_round_trips_per_member"], 2, ""),
                    num(s["redis_reads_per_member"]["median"], 2),
                    num(s["redis_calls_per_member"].get("hmget", 0.0), 2),
                    num(s["redis_scripts_per_member"]["median"], 2),
                    _spread(s["redis_commands_per_member"], 1, ""),
                    num(s["redis_pushes_per_member"]["median"], 2),
                ]
                for api in APIS
                for side in rep["sides"]
                if "redis_commands_per_member" in summary[api][side]
                for s in [summary[api][side]]
            ],
        ),
        "",
    ]
    for api in APIS:
        for side in ("redis-1", "redis-3"):
            r = summary[api][f"ratio_{side}"]
            rounds = ", ".join(f"{x:.2f}" for x in r["rounds"])
            lines.append(
                f"- **{api}: {side} / memory = {r['median']:.2f}×** (median of per-round "
                f"ratios; rounds {rounds})" + ("; target ≥ 0.5×." if side == "redis-1" else ".")
            )
    top = summary["SubmitMember"]["redis-1"].get("redis_calls_per_member", {})
    busiest = sorted(top.items(), key=lambda kv: -kv[1])[:8]
    lines += [
        "- Both APIs hand a replica a group's members faster than one decision takes "
        "(SubmitMember: concurrent calls; StreamGroups: a stream keeps several decisions "
        "in flight), and a replica decides the members of a cohort that arrive while "
        "its read or commit is in flight together: fewer group reads and commits than "
        'members (docs/scaling.md, "Replicas: measured").',
        "- Commands per member by name (SubmitMember, redis-1; scripts' own calls "
        "included): " + ", ".join(f"`{n.upper()}` {v:.2f}" for n, v in busiest) + ".",
        "- **Three replicas do not scale here, and are not expected to:** the machine has "
        f"{out['machine']['cores']} cores, shared by the three servers, redis-server, the "
        "judge and the load generator (and other work). Every variant is CPU-bound, so "
        "spreading one deployment's work over three processes adds the cost of "
        "more processes (three event loops, three gRPC servers, each group read and "
        "committed by every replica that holds some of its members) without adding "
        "cores. What the redis-3 rows show is what spreading every group over three "
        "replicas costs per member (CPU, round trips, commands), each group still judged "
        "once per member with nothing masked; what one replica does on cores of its own "
        "is the redis-1 row.",
    ]
    return "\n".join(lines)
