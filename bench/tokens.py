"""Judge tokens bench (simulated): the adaptive output budget against runaway verdicts.

``python -m bench.tokens [--quick] [--rounds N] [--json PATH] [--update-docs PAGE]``;
also ``make bench``'s "judge tokens" section. Every process is separate: two
``genrm-grpc fake-judge`` farm nodes (``--slots 64``, a fixed decode speed, output
lengths ``bimodal:9000:budget:0.5:1000``: half the attempts converge at 9,000 ± 1,000
tokens, the other half run to the request's own ``max_tokens``), one ``genrm-grpc
serve`` per run and the load generator (``bench/loadgen.py``).

Variants, interleaved within each round (ABAB…): a configured ``judge.max_output_tokens``
of 16,384 and of 49,152, each with and without ``judge.adaptive_budget``. Each run is a
fresh server: a warm-up step (the adaptive budget needs
``judge.adaptive_budget_min_samples`` verdicts first), then the nodes' counters are
reset and the measured step (G groups × 16, every member in flight) runs.

Where the figures come from: output tokens are the nodes' own ``generation_tokens``
(every token the judge generated, aborted requests' partial output included); verdicts
are the server's ``genrm_judge_comparisons_total{outcome="ok"}`` (``/metrics``, before
and after the step); masked share is the members the load generator got back with
``mask_sample``; the server's token ledger (``genrm_judge_verdict_output_tokens``,
``genrm_judge_wasted_output_tokens_total``, ``genrm_judge_adaptive_budget_*``) and the
groups' ``judge_output_tokens_total`` are cross-checks. All figures are simulated (fake
judges on a 2-core machine, no GPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.farm import Node, _spread
from bench.judge_outage import _free_port
from bench.launch import LoadGen, Proc, start_service
from bench.mpreport import publish, section_args

BUDGETS = (16384, 49152)
MODES = ("off", "adaptive")


@dataclass(frozen=True)
class TokensPlan:
    groups: int = 128
    size: int = 16
    warmup_groups: int = 16
    rounds: int = 3
    nodes: int = 2
    slots: int = 64
    tokens_per_s: float = 40.0
    time_scale: float = 0.003
    converge_tokens: int = 9000
    jitter_tokens: int = 1000
    runaway_share: float = 0.5
    budgets: tuple[int, ...] = BUDGETS
    parse_retries: int = 3


QUICK = TokensPlan(groups=16, size=4, warmup_groups=32, rounds=1, time_scale=0.0005)


def _node_args(plan: TokensPlan, seed: int) -> list[str]:
    spec = f"bimodal:{plan.converge_tokens}:budget:{plan.runaway_share:g}:{plan.jitter_tokens}"
    return [
        "--slots", str(plan.slots),
        "--tokens-per-s", str(plan.tokens_per_s),
        "--output-tokens", spec,
        "--time-scale", str(plan.time_scale),
        "--prefix-cache-blocks", "0",
        "--seed", str(seed),
        "--model", "bench-genrm",
    ]  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    """The server's ``genrm_judge_*`` samples, keyed ``name{label=value,...}``."""
    with urllib.request.urlopen(url, timeout=30) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("genrm_judge_"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def ideal_tokens_per_verdict(plan: TokensPlan, cap: float) -> float:
    """Expected output tokens per verdict when a runaway costs ``cap`` tokens.

    Every attempt converges with probability q = 1 − p (mean length A) or runs away with
    probability p (cost ``cap``). With at most n attempts per comparison, attempt k runs
    with probability p^(k−1): verdicts 1 − p^n, runaways p(1 − p^n)/(1 − p), converged
    attempts 1 − p^n; so tokens per verdict = A + cap · p/(1 − p), whatever n."""
    p = plan.runaway_share
    return plan.converge_tokens + cap * p / (1 - p)


def model_tokens_per_verdict(plan: TokensPlan, budget: float, cap: float) -> float:
    """Expected output tokens per verdict with this adaptive ``budget`` under ``cap``: a
    runaway costs the budget, except on the last attempt of a comparison whose every
    earlier attempt was cut (that one goes out with the cap)."""
    p, n = plan.runaway_share, plan.parse_retries + 1
    runaways = budget * (p - p**n) / (1 - p) + cap * p**n
    return plan.converge_tokens + runaways / (1 - p**n)


def ideal_saving(plan: TokensPlan, cap: int) -> float:
    """1 − tokens per verdict with a cap at the longest converged length (A + J) ÷ the
    same at ``cap``."""
    longest = plan.converge_tokens + plan.jitter_tokens
    return 1 - ideal_tokens_per_verdict(plan, longest) / ideal_tokens_per_verdict(plan, cap)


def _server(
    name: str, plan: TokensPlan, nodes: list[Node], cap: int, mode: str, logs: pathlib.Path
) -> tuple[Proc, str]:
    port = _free_port()
    judge: dict[str, Any] = {
        "api": "chat_completions",
        "model": "bench-genrm",
        "urls": [n.url for n in nodes],
        "max_in_flight": plan.slots,
        "max_connections": 256,
        "max_output_tokens": cap,
        # Hedging would send second copies of long attempts: it is another subject.
        "hedge_quantile": None,
        "adaptive_budget": mode == "adaptive",
    }
    server = start_service(
        name,
        nodes[0].url,
        logs,
        concurrency=plan.slots * plan.nodes,
        judge_keys=judge,
        genrm_parse_retries=plan.parse_retries,
        genrm_parse_retry_sleep_s=0.05,
        judge_request_timeout_s=600,
        metrics_listen=f"127.0.0.1:{port}",
    )
    return server, f"http://127.0.0.1:{port}/metrics"


def _step(
    load: LoadGen, server: Proc, plan: TokensPlan, prefix: str, groups: int
) -> dict[str, Any]:
    return load.run(
        target=server.target,
        api="SubmitMember",
        prefix=prefix,
        size=plan.size,
        in_flight=groups,
        groups=groups,
        answer_bytes=400,
        timeout_s=1200,
        group_metrics=True,
    )


def one_run(
    plan: TokensPlan,
    cap: int,
    mode: str,
    nodes: list[Node],
    load: LoadGen,
    logs: pathlib.Path,
    tag: str,
) -> dict[str, Any]:
    server, metrics_url = _server(f"tokens-{tag}", plan, nodes, cap, mode, logs)
    try:
        warm = _step(load, server, plan, f"warm-{tag}", plan.warmup_groups)
        before = scrape(metrics_url)
        for node in nodes:
            node.call("/stats/reset", {})
        started = time.perf_counter()
        out = _step(load, server, plan, f"step-{tag}", plan.groups)
        makespan = time.perf_counter() - started
        after = scrape(metrics_url)
    finally:
        server.stop()
    stats = [n.node_stats() for n in nodes]

    def node_sum(name: str) -> int:
        return sum(int(s[name]) for s in stats)

    verdicts = _delta(after, before, "genrm_judge_comparisons_total{outcome=ok}")
    generated = node_sum("generation_tokens")
    members = out.get("members", 0)
    comparisons = sum(
        _delta(after, before, k) for k in after if k.startswith("genrm_judge_comparisons_total")
    )
    row = {
        "cap": cap,
        "mode": mode,
        "makespan_s": makespan,
        "members": members,
        "masked": out.get("masked", 0),
        "masked_share": out.get("masked", 0) / members if members else float("nan"),
        "errors": out.get("errors", 0),
        "verdicts": verdicts,
        "comparisons": comparisons,
        "tokens_per_verdict": generated / verdicts if verdicts else float("nan"),
        "node_generation_tokens": generated,
        "node_requests": node_sum("requests"),
        "node_completed": node_sum("completed"),
        "node_finished_length": node_sum("finished_length"),
        "node_finished_stop": node_sum("finished_stop"),
        "node_aborted": node_sum("aborted"),
        "server_verdict_tokens": _delta(after, before, "genrm_judge_verdict_output_tokens_sum"),
        "server_verdicts_histogram": _delta(
            after, before, "genrm_judge_verdict_output_tokens_count"
        ),
        "server_wasted_tokens": _delta(after, before, "genrm_judge_wasted_output_tokens_total"),
        "adaptive_cuts": _delta(after, before, "genrm_judge_adaptive_budget_cuts_total"),
        "budget_after_warmup": before.get("genrm_judge_adaptive_budget_tokens"),
        "budget_at_end": after.get("genrm_judge_adaptive_budget_tokens"),
        "group_output_tokens": out.get("group_metrics", {}).get("judge_output_tokens_total", 0.0),
        "group_wasted_tokens": out.get("group_metrics", {}).get(
            "judge_output_tokens_wasted_total", 0.0
        ),
        "group_adaptive_cuts": out.get("group_metrics", {}).get("judge_adaptive_budget_cuts", 0.0),
        "groups_with_metrics": out.get("groups_with_metrics", 0),
        "warmup_masked": warm.get("masked", 0),
    }
    row["requests_per_comparison"] = row["node_requests"] / comparisons if comparisons else 0.0
    row["runaway_share"] = (
        row["node_finished_length"] / row["node_completed"] if row["node_completed"] else 0.0
    )
    return row


def run(plan: TokensPlan, logs: pathlib.Path) -> dict[str, Any]:
    logs.mkdir(parents=True, exist_ok=True)
    variants = [(cap, mode) for cap in plan.budgets for mode in MODES]
    nodes: list[Node] = []
    load: LoadGen | None = None
    runs: list[dict[str, Any]] = []
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load0 = list(os.getloadavg())
    try:
        nodes = [
            Node(f"tokens-node-{k}", _node_args(plan, seed=k + 1), logs) for k in range(plan.nodes)
        ]
        load = LoadGen(logs)
        for r in range(plan.rounds):
            order = variants if r % 2 == 0 else list(reversed(variants))
            for cap, mode in order:
                row = one_run(plan, cap, mode, nodes, load, logs, f"{cap}-{mode}-{r}")
                row["round"] = r
                runs.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        if load is not None:
            load.stop()
        for node in nodes:
            node.stop()
    return {
        "plan": plan.__dict__,
        "runs": runs,
        "summary": summarize(plan, runs),
        "started_at": started_at,
        "loadavg": [load0, list(os.getloadavg())],
        "cores": len(os.sched_getaffinity(0)),
    }


def summarize(plan: TokensPlan, runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for cap in plan.budgets:
        entry: dict[str, Any] = {"ideal_saving": ideal_saving(plan, cap)}
        for mode in MODES:
            mine = [r for r in runs if r["cap"] == cap and r["mode"] == mode]
            entry[mode] = {
                name: _spread([float(r[name]) for r in mine])
                for name in (
                    "tokens_per_verdict",
                    "masked_share",
                    "makespan_s",
                    "requests_per_comparison",
                    "runaway_share",
                    "adaptive_cuts",
                    "node_aborted",
                )
            }
            budgets = [r["budget_at_end"] for r in mine if r["budget_at_end"] is not None]
            entry[mode]["budget"] = _spread(budgets) if budgets else None
        # The saving of each round: its adaptive run against its run without (same round).
        savings = []
        for r in sorted({x["round"] for x in runs}):
            pair = {x["mode"]: x for x in runs if x["cap"] == cap and x["round"] == r}
            if set(pair) == set(MODES):
                savings.append(
                    1 - pair["adaptive"]["tokens_per_verdict"] / pair["off"]["tokens_per_verdict"]
                )
        entry["saving"] = _spread(savings)
        entry["saving_vs_ideal"] = entry["saving"]["median"] / entry["ideal_saving"]
        budget = entry["adaptive"]["budget"]
        if budget is not None:
            b = budget["median"]
            entry["model_saving_at_budget"] = 1 - model_tokens_per_verdict(
                plan, b, cap
            ) / ideal_tokens_per_verdict(plan, cap)
        entry["saving_ok"] = entry["saving_vs_ideal"] >= 0.8
        entry["masked_ok"] = (
            entry["adaptive"]["masked_share"]["median"] <= entry["off"]["masked_share"]["max"]
        )
        summary[str(cap)] = entry
    return summary


def markdown(result: dict[str, Any]) -> str:
    plan = result["plan"]
    a, j = plan["converge_tokens"], plan["jitter_tokens"]
    p = plan["runaway_share"]
    slots = plan["nodes"] * plan["slots"]
    load = "; ".join(", ".join(f"{x:.2f}" for x in la) for la in result["loadavg"])
    lines = [
        f"**Simulated**: {plan['nodes']} fake-judge farm nodes, `--slots {plan['slots']}`, "
        f"{plan['tokens_per_s']:g} tokens/s per request × time scale "
        f"{plan['time_scale']:g} (a simulated second lasts {plan['time_scale']:g} s), "
        f"output lengths `bimodal:{a}:budget:{p:g}:{j}` ({100 * (1 - p):.0f} % of attempts "
        f"converge at {a:,} ± {j:,} tokens, {100 * p:.0f} % run to the request's budget); "
        f"`judge_max_concurrency` {slots}, `genrm_parse_retries` {plan['parse_retries']}, "
        "hedging off, adaptive-budget defaults (quantile 0.99, margin 1.2, floor 1,024, "
        f"64 samples). Per run a fresh `genrm-grpc serve`, a warm-up step of "
        f"{plan['warmup_groups']} groups × {plan['size']}, then the measured step of "
        f"{plan['groups']} groups × {plan['size']} (circular, every member in flight); "
        f"{plan['rounds']} rounds, the four variants interleaved (ABAB). Median (min–max) "
        f"of the rounds. Measured from {result['started_at']} on {result['cores']} shared "
        f"cores (load average 1/5/15 min at start and end: {load}).",
        "",
        "| `judge.max_output_tokens` | `judge.adaptive_budget` | judge output tokens per "
        "verdict | masked share | step makespan s | adaptive budget (tokens) | saving "
        "| ideal saving | saving ÷ ideal (target ≥ 0.8) | masked not higher |",
        "| --: | :-- | --: | --: | --: | --: | --: | --: | :-: | :-: |",
    ]

    def cell(v: dict[str, float] | None, fmt: str) -> str:
        if v is None:
            return "—"
        return f"{v['median']:{fmt}} ({v['min']:{fmt}}–{v['max']:{fmt}})"

    for cap, e in result["summary"].items():
        for mode in MODES:
            s = e[mode]
            tail = "| | | | |"
            if mode == "adaptive":
                tail = (
                    f"| {cell(e['saving'], '.1%')} | {e['ideal_saving']:.1%} "
                    f"| {e['saving_vs_ideal']:.2f} {'✔' if e['saving_ok'] else '✘'} "
                    f"| {'✔' if e['masked_ok'] else '✘'} |"
                )
            lines.append(
                f"| {int(cap):,} | {'on' if mode == 'adaptive' else 'off'} "
                f"| {cell(s['tokens_per_verdict'], ',.0f')} | {cell(s['masked_share'], '.1%')} "
                f"| {cell(s['makespan_s'], '.1f')} | {cell(s['budget'], ',.0f')} {tail}"
            )
    longest = a + j
    lines += [
        "",
        "Output tokens: the nodes' own `generation_tokens` (every token generated, the "
        "partial output of requests aborted when a group was masked included) ÷ the "
        'server\'s `genrm_judge_comparisons_total{outcome="ok"}` in the step. Masked '
        "share: members returned with `mask_sample` ÷ members. Saving: per round, 1 − "
        "tokens per verdict with the adaptive budget ÷ the same without, same round.",
        "",
        f"Ideal saving, from the model: an attempt converges with probability q = "
        f"{1 - p:g} (mean {a:,} tokens) or runs away with p = {p:g} and costs the cap C. "
        "With at most n attempts per comparison, attempt k runs with probability "
        "p^(k−1), so a comparison makes 1 − pⁿ verdicts and p(1 − pⁿ)/(1 − p) runaways "
        f"on average: tokens per verdict = {a:,} + C·p/(1 − p), whatever n. A cap exactly "
        f"at the longest converged length ({longest:,}) gives {a + longest * p / (1 - p):,.0f}"
        " tokens per verdict; ideal saving = 1 − that ÷ the same at C = the configured "
        "budget: "
        + ", ".join(f"{int(c):,}: {e['ideal_saving']:.1%}" for c, e in result["summary"].items())
        + ".",
        "",
        "Profile of the runs (median of rounds): judge requests per comparison, share "
        "of completed requests that hit their budget (`finish_reason: length`), attempts "
        "the adaptive budget cut (`genrm_judge_adaptive_budget_cuts_total`), requests "
        "aborted on the nodes (a masked group's other comparisons are cancelled), and the "
        "saving the model predicts for the budget the service actually learned (a runaway "
        "costs that budget, the last attempt of an all-cut comparison the cap):",
        "",
        "| `max_output_tokens` | adaptive | requests per comparison | runaway share | "
        "cut attempts | aborted requests | model saving at the learned budget |",
        "| --: | :-- | --: | --: | --: | --: | --: |",
    ]
    for cap, e in result["summary"].items():
        for mode in MODES:
            s = e[mode]
            model = ""
            if mode == "adaptive" and "model_saving_at_budget" in e:
                model = f"{e['model_saving_at_budget']:.1%}"
            lines.append(
                f"| {int(cap):,} | {'on' if mode == 'adaptive' else 'off'} "
                f"| {s['requests_per_comparison']['median']:.2f} "
                f"| {s['runaway_share']['median']:.1%} | {s['adaptive_cuts']['median']:,.0f} "
                f"| {s['node_aborted']['median']:,.0f} | {model} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tokens", description=__doc__)
    parser.add_argument("--time-scale", type=float, help="the nodes' --time-scale")
    section_args(parser, "build/bench/tokens")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else TokensPlan()
    changes = {"rounds": args.rounds, "groups": args.groups, "time_scale": args.time_scale}
    plan = TokensPlan(**{**plan.__dict__, **{k: v for k, v in changes.items() if v}})
    result = run(plan, pathlib.Path(args.logs))
    text = markdown(result)
    publish(
        args,
        result,
        text,
        name="judge-tokens",
        title="Judge tokens (simulated)",
        module="bench.tokens",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
