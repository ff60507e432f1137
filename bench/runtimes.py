"""``python -m bench.runtimes``: one process on its two runtimes, in the same run.

Issue 22 makes the replicas' runtime (``runtime: groups``) the single process's too, on
the condition that the single-process path gets no slower. This measures that condition
the way sections 1, 2 and 11 of ``make bench`` measure the service: separate processes
(the load generator, two ``genrm-grpc serve`` servers identical but for ``runtime``, the
instant judge of §1 over HTTP), real gRPC over loopback, the sides interleaved round by
round (the order reversed every other round), server CPU read from the servers'
processes. Four cases, each on the default store (a fresh SQLite file per server) and on
``memory://``: 16-member groups as in §1/§11 and 1-member groups as in §2, each through
``SubmitMember`` and ``StreamGroups``. The ratio is ``groups`` / ``registry`` throughput,
the median of the per-round ratios, with the rounds. The judge answers at once: these are
CPU figures of this machine's service code, not a GPU judge's latencies.
"""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import asdict, dataclass
from typing import Any

from bench.launch import Judge, LoadGen, Proc, fresh_store, start_service
from bench.mpreport import HEADERS, _side_rows, publish, section_args
from bench.multiproc import APIS, MultiPlan, abab, warm
from bench.util import md_table

RUNTIMES = ("groups", "registry")
STORES = ("sqlite", "memory")


@dataclass(frozen=True)
class RuntimesPlan:
    rounds: int = 3
    group_size: int = 16
    groups: int = 96
    in_flight: int = 32
    single_groups: int = 1500
    single_in_flight: int = 128
    warmup_groups: int = 16
    answer_bytes: int = 2048
    concurrency: int = 64
    stores: tuple[str, ...] = STORES
    sizes: tuple[int, ...] = (16, 1)


QUICK = RuntimesPlan(rounds=1, groups=12, single_groups=200, warmup_groups=2)


def _case(
    plan: RuntimesPlan, load: LoadGen, judge: Judge, logs: pathlib.Path, store: str, size: int
) -> dict[str, Any]:
    servers: dict[str, Proc] = {}
    try:
        for runtime in RUNTIMES:
            name = f"runtime-{runtime}-{store}-{size}"
            url = fresh_store(logs, name) if store == "sqlite" else "memory://"
            extra: dict[str, Any] = {"runtime": runtime}
            if size > 1:
                extra["num_rollouts_per_prompt"] = size
            servers[runtime] = start_service(
                name, judge, logs, concurrency=plan.concurrency, store=url, **extra
            )
        groups = plan.groups if size > 1 else plan.single_groups
        in_flight = plan.in_flight if size > 1 else plan.single_in_flight
        warmup = plan.warmup_groups if size > 1 else plan.warmup_groups * 8
        for proc in servers.values():
            warm(load, proc, size, warmup, in_flight)
        return abab(
            MultiPlan(rounds=plan.rounds),
            load,
            servers,
            judge,
            apis=APIS,
            rounds=plan.rounds,
            size=size,
            groups=groups,
            in_flight=in_flight,
            answer_bytes=plan.answer_bytes,
        )
    finally:
        for proc in servers.values():
            proc.stop()


def run(plan: RuntimesPlan, logs: pathlib.Path) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    judge = Judge("judge-instant", 0.0, logs)
    load = LoadGen(logs)
    cases: dict[str, Any] = {}
    try:
        for size in plan.sizes:
            for store in plan.stores:
                print(f"runtimes: {size}-member groups on {store}", flush=True)
                cases[f"{size}-{store}"] = _case(plan, load, judge, logs, store, size)
    finally:
        load.stop()
        judge.stop()
    return {"plan": asdict(plan), "cases": cases}


def markdown(result: dict[str, Any]) -> str:
    plan = result["plan"]
    lines = [
        "Two `genrm-grpc serve` processes per case, identical but for `runtime` (`groups`: "
        "the replicas' runtime over the in-process group store; `registry`: the "
        "single-process runtime), measured in the same rounds, the order reversed every "
        f"other round ({plan['rounds']} rounds). The instant judge of §1 over HTTP: CPU "
        "figures of this machine, no GPU judge. "
        f"16-member groups: {plan['groups']} per run, {plan['in_flight']} in flight; "
        f"1-member groups: {plan['single_groups']:,} per run, {plan['single_in_flight']} "
        f"in flight; {plan['answer_bytes']:,}-byte answers. `sqlite`: a fresh file per "
        "server (the default store).",
        "",
    ]
    for name, case in result["cases"].items():
        size, store = name.split("-", 1)
        lines += [
            f"### {size}-member groups, {store}",
            "",
            md_table(HEADERS, _side_rows(case["summary"], case["sides"])),
            "",
        ]
        for api in APIS:
            ratio = case["summary"][api]["ratio"]
            rounds = ", ".join(f"{x:.2f}" for x in ratio["rounds"])
            lines.append(
                f"- **{api}: groups / registry = {ratio['median']:.2f}×** (rounds {rounds})."
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtimes", description=__doc__)
    parser.add_argument("--stores", nargs="+", choices=STORES, help="default: both")
    parser.add_argument("--sizes", nargs="+", type=int, choices=(1, 16), help="default: both")
    section_args(parser, "build/bench/runtimes")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else RuntimesPlan()
    changes = {
        "rounds": args.rounds,
        "groups": args.groups,
        "stores": tuple(args.stores) if args.stores else None,
        "sizes": tuple(args.sizes) if args.sizes else None,
    }
    plan = RuntimesPlan(**{**asdict(plan), **{k: v for k, v in changes.items() if v}})
    result = run(plan, pathlib.Path(args.logs))
    publish(
        args,
        result,
        markdown(result),
        name="runtimes",
        title="One process, two runtimes: `groups` vs `registry` (separate processes)",
        module="bench.runtimes",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
