"""Judge farm bench (simulated): routing policies over four fake-judge farm nodes.

``python -m bench.farm [--quick] [--rounds N] [--json PATH]``; ``make bench`` runs
``--all``: the three configurations of its "Judge farm" section (``SECTIONS``).
Every process is separate: four ``genrm-grpc fake-judge`` farm nodes
(``--slots 8``, bimodal output lengths: 60 % converge at A tokens, 40 % run 1.8× longer,
a prefix-cache model with a prefill cost per uncached prompt token), one ``genrm-grpc
serve`` per run, the load generator (``bench/loadgen.py``: one step of G groups × 16,
every member in flight), and for the L4 variant ``bench/l4proxy.py``.

Variants, interleaved within each round (ABAB…):

* ``affinity`` — this service's routing (``judge.routing: affinity``);
* ``round_robin`` — each request to the next endpoint with room;
* ``hash`` — a static hash of the cohort (as NeMo Gym's model server pins a session);
* ``l4`` — one ``judge.url`` in front of a connection-level balancer (round robin per
  connection).

The lower bound of a step's makespan is the slot time of the requests that completed
(the nodes' ``slot_ms_completed``) ÷ the total slots; makespan ÷ lower bound ≥ 1, and the
healthy target is ≤ 1/0.9. Then the sick node: one of the four starts hanging once a
third of the passes are done; its lower bound is the same work on the three healthy
nodes. All figures are simulated (fake judges on a 2-core machine, no GPU).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench.launch import MODEL, FakeJudge, LoadGen, Proc, start_service
from bench.mpreport import publish, section_args, write_section

SLOTS = 8
NODES = 4


@dataclass(frozen=True)
class FarmPlan:
    groups: int = 128
    size: int = 16
    rounds: int = 3
    tokens_per_s: float = 400.0
    converge_tokens: int = 200
    time_scale: float = 0.25
    prefill_ms_per_token: float = 0.5
    prompt_words: int = 300
    answer_bytes: int = 400
    variants: tuple[str, ...] = ("affinity", "round_robin", "hash", "l4")
    sick: bool = True
    #: judge.max_in_flight per node: SLOTS = no queue at the nodes (routing is forced
    #: by whichever node frees a slot); more leaves routing a choice.
    in_flight_per_node: int = SLOTS
    #: judge.scrape_metrics_s (None: off).
    scrape_metrics_s: float | None = None


QUICK = FarmPlan(groups=32, size=4, rounds=1, variants=("affinity", "round_robin"))


def _node_args(plan: FarmPlan) -> list[str]:
    a = plan.converge_tokens
    return [
        "--slots", str(SLOTS),
        "--tokens-per-s", str(plan.tokens_per_s),
        "--output-tokens", f"bimodal:{a}:{round(a * 1.8)}:0.4:{a // 10}",
        "--prefill-ms-per-token", str(plan.prefill_ms_per_token),
        "--time-scale", str(plan.time_scale),
    ]  # fmt: skip


class Node(FakeJudge):
    """A farm node: the fake judge started with ``args`` (its node flags)."""

    def __init__(self, name: str, args: list[str], logs: pathlib.Path) -> None:
        super().__init__(name, logs, *args)

    def node_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.call("/stats")["node"]
        return stats


def _fresh(nodes: list[Node]) -> None:
    for node in nodes:
        node.call("/control", {"mode": "ok", "clear_prefix_cache": True})
        node.call("/stats/reset", {})


def _server(
    name: str,
    variant: str,
    urls: list[str],
    logs: pathlib.Path,
    per_node: int = SLOTS,
    scrape_s: float | None = None,
) -> Proc:
    judge: dict[str, Any] = {"api": "chat_completions", "model": MODEL}
    if variant != "l4" and len(urls) > 1:
        judge["urls"] = urls
        judge["routing"] = variant
    # Per endpoint: its slots (the proxy stands for all four nodes).
    judge["max_in_flight"] = per_node * NODES if variant == "l4" else per_node
    judge["max_connections"] = 256
    if scrape_s is not None:
        judge["scrape_metrics_s"] = scrape_s
    return start_service(
        name,
        urls[0],
        logs,
        concurrency=SLOTS * NODES,
        judge_keys=judge,
        genrm_parse_retries=3,
        genrm_parse_retry_sleep_s=0.05,
        judge_request_timeout_s=600,
    )


def one_run(
    plan: FarmPlan,
    variant: str,
    nodes: list[Node],
    load: LoadGen,
    logs: pathlib.Path,
    tag: str,
    *,
    sick: bool = False,
) -> dict[str, Any]:
    _fresh(nodes)
    proxy = None
    urls = [n.url for n in nodes]
    if variant == "l4":
        proxy = Proc(
            f"l4proxy-{tag}",
            [sys.executable, "-m", "bench.l4proxy", *(u.removeprefix("http://") for u in urls)],
            r"listening on [\d.]+:(\d+)",
            logs,
        )
        urls = [f"http://127.0.0.1:{proxy.port}"]
    server = _server(
        f"farm-{tag}", variant, urls, logs, plan.in_flight_per_node, plan.scrape_metrics_s
    )
    passes = plan.groups * plan.size
    try:
        started = time.perf_counter()
        load.send(
            target=server.target,
            api="SubmitMember",
            prefix=f"farm-{tag}",
            size=plan.size,
            in_flight=plan.groups,
            groups=plan.groups,
            answer_bytes=plan.answer_bytes,
            prompt_words=plan.prompt_words,
        )
        if sick:
            # One node starts hanging once a third of the passes are done (its own count
            # of completed requests reaching a quarter of a third: it has its share).
            nodes[0].call(f"/wait?completed={max(1, passes // (3 * NODES))}&timeout=300")
            nodes[0].call("/control", {"mode": "hang"})
        out = load.result()
        makespan = time.perf_counter() - started
    finally:
        server.stop()
        if proxy is not None:
            proxy.stop()
    stats = [n.node_stats() for n in nodes]
    healthy = stats[1:] if sick else stats
    work_s = sum(s["slot_ms_completed"] for s in stats) / 1000
    held_s = sum(s["slot_ms"] for s in stats) / 1000
    slots = SLOTS * len(healthy)
    lower = work_s / slots
    prompt = sum(s["prompt_tokens"] for s in stats)
    requests = sum(s["requests"] for s in stats)
    return {
        "variant": variant,
        "sick": sick,
        "makespan_s": makespan,
        "lower_bound_s": lower,
        "ratio": makespan / lower if lower else float("nan"),
        "occupancy": held_s / (SLOTS * NODES * makespan),
        "cached_share": sum(s["cached_tokens"] for s in stats) / prompt if prompt else 0.0,
        "requests_per_pass": requests / passes,
        "extra_requests_pct": 100 * (requests - passes) / passes,
        "masked": out.get("masked", 0),
        "errors": out.get("errors", 0),
        "members": out.get("members", 0),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(plan: FarmPlan, logs: pathlib.Path) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    nodes: list[Node] = []
    load: LoadGen | None = None
    runs: list[dict[str, Any]] = []
    try:
        nodes = [Node(f"farm-node-{k}", _node_args(plan), logs) for k in range(NODES)]
        load = LoadGen(logs)
        for r in range(plan.rounds):
            order = plan.variants if r % 2 == 0 else tuple(reversed(plan.variants))
            for variant in order:
                row = one_run(plan, variant, nodes, load, logs, f"{variant}-{r}")
                runs.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            if plan.sick:
                row = one_run(plan, "affinity", nodes, load, logs, f"sick-{r}", sick=True)
                runs.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        if load is not None:
            load.stop()
        for node in nodes:
            node.stop()
    summary: dict[str, Any] = {}
    for key in [*plan.variants, *(["sick"] if plan.sick else [])]:
        mine = [
            r
            for r in runs
            if (r["sick"] and key == "sick") or (not r["sick"] and r["variant"] == key)
        ]
        summary[key] = {
            name: _spread([r[name] for r in mine])
            for name in (
                "ratio",
                "makespan_s",
                "lower_bound_s",
                "occupancy",
                "cached_share",
                "requests_per_pass",
                "extra_requests_pct",
                "masked",
            )
        }
    return {"plan": plan.__dict__, "runs": runs, "summary": summary}


def markdown(result: dict[str, Any]) -> str:
    plan = result["plan"]
    lines = [
        f"Simulated: four fake-judge farm nodes, `--slots {SLOTS}`, {plan['tokens_per_s']:g} "
        f"tokens/s × time scale {plan['time_scale']:g}, output lengths bimodal (60 % at "
        f"{plan['converge_tokens']} ± {plan['converge_tokens'] // 10} tokens, 40 % at 1.8×), "
        f"prefill {plan['prefill_ms_per_token']:g} ms per uncached prompt token; one step of "
        f"{plan['groups']} groups × {plan['size']} (circular), every member in flight; "
        f"`judge_max_concurrency` {SLOTS * NODES}, `judge.max_in_flight` "
        f"{plan['in_flight_per_node']} per node"
        + (
            f", `judge.scrape_metrics_s` {plan['scrape_metrics_s']:g}"
            if plan.get("scrape_metrics_s")
            else ""
        )
        + f"; {plan['rounds']} rounds, variants "
        "interleaved. Median (min–max) of the rounds.",
        "",
        "| routing | makespan ÷ lower bound | target ≤ 1.11 | makespan s | slot occupancy "
        "| prefix-cache hit share | judge requests per pass | members masked |",
        "| :-- | --: | :-: | --: | --: | --: | --: | --: |",
    ]
    names = {
        "affinity": "this service (`affinity`)",
        "round_robin": "round robin",
        "hash": "static hash per cohort (NeMo Gym's model server)",
        "l4": "one URL behind an L4 balancer",
        "sick": "this service, one node hangs mid-run",
    }
    for key, s in result["summary"].items():
        target = 1.2 if key == "sick" else 1 / 0.9
        ok = "✔" if s["ratio"]["median"] <= target else "✘"
        if key == "sick":
            ok = (
                "✔"
                if (
                    s["ratio"]["median"] <= 1.2
                    and s["masked"]["max"] == 0
                    and s["extra_requests_pct"]["median"] <= 2
                )
                else "✘"
            )

        def cell(name: str, fmt: str, s: dict[str, Any] = s) -> str:
            v = s[name]
            return f"{v['median']:{fmt}} ({v['min']:{fmt}}–{v['max']:{fmt}})"

        lines.append(
            f"| {names[key]} | {cell('ratio', '.2f')} | {ok} | {cell('makespan_s', '.1f')} "
            f"| {cell('occupancy', '.2f')} | {cell('cached_share', '.0%')} "
            f"| {cell('requests_per_pass', '.3f')} | {cell('masked', '.0f')} |"
        )
    lines += [
        "",
        "Lower bound: the slot time of the requests that completed (the nodes' "
        "`slot_ms_completed`) ÷ the slots (32; 24 for the sick run, the three healthy "
        "nodes). Occupancy: slot time held (aborted requests included) ÷ (32 slots × "
        "makespan). The sick row's target is ≤ 1.2× its lower bound, 0 masked and extra "
        "judge requests ≤ 2 % of passes.",
    ]
    return "\n".join(lines)


#: The three configurations of ``make bench``'s section (``--all``): the recommended
#: sizing (every routing, then the sick node), and two with room for the routing to
#: choose, where the misses are (heading, the equivalent command's flags, the plan).
SECTIONS: tuple[tuple[str, str, FarmPlan], ...] = (
    ("Sized as recommended: `judge.max_in_flight` = the node's slots", "", FarmPlan()),
    (
        "With headroom: `judge.max_in_flight` 16 per node (twice its slots)",
        " --in-flight-per-node 16 --variants affinity,round_robin,hash --no-sick --rounds 2",
        FarmPlan(
            in_flight_per_node=16,
            variants=("affinity", "round_robin", "hash"),
            sick=False,
            rounds=2,
        ),
    ),
    (
        "With headroom and vLLM metrics scraped every 0.2 s",
        " --in-flight-per-node 16 --scrape-metrics-s 0.2 --variants affinity,round_robin"
        " --no-sick --rounds 2",
        FarmPlan(
            in_flight_per_node=16,
            scrape_metrics_s=0.2,
            variants=("affinity", "round_robin"),
            sick=False,
            rounds=2,
        ),
    ),
)


def findings(result: dict[str, Any]) -> str:
    """What the table says, in words, from its own figures (no hand-written numbers)."""
    summary = result["summary"]
    lines = []
    met = [k for k in summary if k != "sick" and summary[k]["ratio"]["median"] <= 1 / 0.9]
    missed = [k for k in summary if k != "sick" and k not in met]
    if not missed:
        cached = [summary[k]["cached_share"]["median"] for k in summary if k != "sick"]
        lines.append(
            "Every routing meets the healthy target; their prefix-cache hit shares lie "
            f"within {min(cached):.0%}–{max(cached):.0%}."
        )
    for key in missed:
        others = [k for k in summary if k not in ("sick", key)]
        if not others:
            lines.append(f"✘ `{key}` misses the healthy target.")
            continue
        best = min(others, key=lambda k: summary[k]["ratio"]["median"])
        s, b = summary[key], summary[best]
        lines.append(
            f"✘ `{key}` misses the healthy target: {s['ratio']['median']:.2f}× the lower "
            f"bound, slot occupancy {s['occupancy']['median']:.2f} against "
            f"{b['occupancy']['median']:.2f} for `{best}`, prefix-cache hit share "
            f"{s['cached_share']['median']:.0%} against {b['cached_share']['median']:.0%}."
        )
    if "sick" in summary:
        s = summary["sick"]
        lines.append(
            f"One node hanging mid-run: {s['ratio']['median']:.2f}× the healthy three's "
            f"lower bound, {s['masked']['max']:.0f} members masked, "
            f"{s['extra_requests_pct']['median']:.1f} % of passes cost a second request."
        )
    lines.append(
        "Why, and what it means for sizing: "
        "[judge-farm.md](judge-farm.md#what-the-farm-bench-shows)."
    )
    return "\n\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.farm", description=__doc__)
    parser.add_argument(
        "--in-flight-per-node", type=int, help=f"judge.max_in_flight (default {SLOTS})"
    )
    parser.add_argument("--scrape-metrics-s", type=float, help="judge.scrape_metrics_s")
    parser.add_argument("--variants", help="comma-separated subset of the variants")
    parser.add_argument("--no-sick", action="store_true", help="skip the sick-node runs")
    section_args(parser, "build/bench/farm")
    parser.add_argument(
        "--all",
        action="store_true",
        help="run the three configurations of make bench's section (ignores the plan flags)",
    )
    args = parser.parse_args(argv)
    if args.all:
        return _all(args)
    plan = QUICK if args.quick else FarmPlan()
    if args.rounds:
        plan = FarmPlan(**{**plan.__dict__, "rounds": args.rounds})
    if args.groups:
        plan = FarmPlan(**{**plan.__dict__, "groups": args.groups})
    if args.in_flight_per_node:
        plan = FarmPlan(**{**plan.__dict__, "in_flight_per_node": args.in_flight_per_node})
    if args.variants:
        plan = FarmPlan(**{**plan.__dict__, "variants": tuple(args.variants.split(","))})
    if args.scrape_metrics_s:
        plan = FarmPlan(**{**plan.__dict__, "scrape_metrics_s": args.scrape_metrics_s})
    if args.no_sick:
        plan = FarmPlan(**{**plan.__dict__, "sick": False})
    result = run(plan, pathlib.Path(args.logs))
    text = markdown(result)
    publish(
        args, result, text, name="judge-farm", title="Judge farm (simulated)", module="bench.farm"
    )
    return 0


def _all(args: argparse.Namespace) -> int:
    parts = [
        "## Judge farm (simulated)",
        "`python -m bench.farm --all` (part of `make bench`). Every figure comes from "
        "fake-judge farm nodes on a 2-core machine: simulated generation, not a GPU "
        "measurement.",
    ]
    results = []
    for heading, flags, plan in SECTIONS:
        result = run(plan, pathlib.Path(args.logs))
        results.append(result)
        parts += [
            f"### {heading}",
            f"`python -m bench.farm{flags}`",
            markdown(result),
            findings(result),
        ]
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    if args.update_docs:
        page = pathlib.Path(args.update_docs)
        page.write_text(write_section(page.read_text(), "judge-farm", text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
