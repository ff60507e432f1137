"""Markdown for the multi-process sections of docs/performance.md, and kept sections.

A *kept section* is text between ``<!-- BEGIN KEPT SECTION: name -->`` and
``<!-- END KEPT SECTION: name -->`` in docs/performance.md: written by hand or by another
generator, it survives ``make bench``, which copies it from the old file into the new one.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
from collections.abc import Sequence
from typing import Any

from bench.util import mark, md_table, num

KEPT_SECTIONS = (
    "judge-client",
    "hot-path",
    "sqlite-writes",
    "judge-farm",
    "judge-tokens",
    "vs-nemo-gym",
    "runtimes",
)
TARGETS = {
    "cpu_per_judge_call_us": 300.0,
    "saturation": 0.85,
    "SubmitMember": 0.6,
    "StreamGroups": 0.8,
    "single": 0.6,
    #: 1-member SubmitMember on the default store (a SQLite file) vs the bare echo.
    "single_sqlite": 0.5,
    "retained_p99": 1.2,
    "store_ratio": 0.85,
    "restart_s": 2.0,
}
_KEPT = re.compile(
    r"<!-- BEGIN KEPT SECTION: (?P<name>[\w-]+) -->\n(?P<body>.*?)"
    r"<!-- END KEPT SECTION: (?P=name) -->",
    re.S,
)


def kept_placeholder(name: str) -> str:
    return (
        f"<!-- BEGIN KEPT SECTION: {name} -->\n"
        f"<!-- (kept by make bench: text here is copied into every regenerated file) -->\n"
        f"<!-- END KEPT SECTION: {name} -->"
    )


def write_section(page: str, name: str, body: str) -> str:
    """``page`` with kept section ``name`` holding ``body`` (inserted before the page's
    "## Reproduce" heading, or at the end, when the page has no such section yet)."""
    block = (
        f"<!-- BEGIN KEPT SECTION: {name} -->\n{body.rstrip()}\n<!-- END KEPT SECTION: {name} -->"
    )
    for m in _KEPT.finditer(page):
        if m["name"] == name:
            return page[: m.start()] + block + page[m.end() :]
    marker = "\n## Reproduce"
    if marker in page:
        at = page.index(marker)
        return page[:at].rstrip("\n") + "\n\n" + block + "\n" + page[at:]
    return page.rstrip("\n") + "\n\n" + block + "\n"


def section_args(parser: argparse.ArgumentParser, logs: str) -> None:
    """The flags every section run on its own takes: ``--quick``, ``--rounds``,
    ``--groups``, ``--json``, ``--update-docs PAGE`` and ``--logs``."""
    parser.add_argument("--quick", action="store_true", help="a small step, one round")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    parser.add_argument("--groups", type=int, help="groups per step (default 128)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument(
        "--update-docs",
        metavar="PAGE",
        help="write the section into this page (docs/performance.md), between its markers",
    )
    parser.add_argument("--logs", default=logs, help="process logs")


def publish(
    args: argparse.Namespace, result: Any, text: str, *, name: str, title: str, module: str
) -> None:
    """Write ``result`` to ``--json``, print ``text`` and, with ``--update-docs``, put it
    into kept section ``name`` of that page under ``## title``."""
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2))
    print(text)
    if args.update_docs:
        page = pathlib.Path(args.update_docs)
        command = f"python -m {module}" + (" --quick" if args.quick else "")
        body = f"## {title}\n\n`{command}` (part of `make bench`).\n\n{text}\n"
        page.write_text(write_section(page.read_text(), name, body))


def keep_sections(new: str, old: str | None) -> str:
    """``new`` with every kept section's body taken from ``old`` where ``old`` has it.

    A kept section that ``old`` has but ``new`` has no placeholder for is appended at the
    end, so nothing written by hand is ever lost."""
    if not old:
        return new
    bodies = {m["name"]: m["body"] for m in _KEPT.finditer(old)}

    def fill(m: re.Match[str]) -> str:
        name = m["name"]
        body = bodies.pop(name, m["body"])
        return f"<!-- BEGIN KEPT SECTION: {name} -->\n{body}<!-- END KEPT SECTION: {name} -->"

    out = _KEPT.sub(fill, new)
    for name, body in bodies.items():
        out = out.rstrip("\n") + (
            f"\n\n<!-- BEGIN KEPT SECTION: {name} -->\n{body}<!-- END KEPT SECTION: {name} -->\n"
        )
    return out


def _spread(s: dict[str, Any], digits: int = 2, unit: str = "×") -> str:
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


# ----------------------------------------------------------------------------- targets
def target_rows(out: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    prof = "§5"
    budget = "§3 CPU budget, §5"
    sat = out.get("saturation")
    if sat:
        s64 = sat["summary"].get("service-64")
        if s64:
            cpu = s64["cpu_us_per_judge_call"]["median"]
            base = sat["summary"]["baseline-64"]["cpu_us_per_judge_call"]["median"]
            rows.append(
                [
                    "server CPU per judge call ≤ 300 µs at C = 64",
                    f"{num(cpu, 0)} µs (baseline {num(base, 0)} µs)",
                    mark(cpu <= TARGETS["cpu_per_judge_call_us"])
                    + ("" if cpu <= TARGETS["cpu_per_judge_call_us"] else f" ({budget})"),
                ]
            )
        for c in sat["levels"]:
            if c not in (64, 256):
                continue
            s = sat["summary"][f"service-{c}"]
            ok = s["saturation"]["median"] >= TARGETS["saturation"]
            rows.append(
                [
                    f"judge saturation ≥ 0.85× C/L at C = {c} (L = {sat['latency_ms']:.0f} ms)",
                    _spread(s["saturation"]),
                    mark(ok) + ("" if ok else f" ({budget})"),
                ]
            )
        never = all(sat["summary"][f"service-{c}"]["max_in_flight"] <= c for c in sat["levels"])
        rows.append(
            [
                "judge never sees more than C requests in flight",
                ", ".join(
                    f"C={c}: {sat['summary'][f'service-{c}']['max_in_flight']}"
                    for c in sat["levels"]
                ),
                mark(never),
            ]
        )
    thr = out.get("throughput")
    if thr:
        for api in ("SubmitMember", "StreamGroups"):
            r = thr["summary"][api]["ratio"]
            ok = r["median"] >= TARGETS[api]
            rows.append(
                [
                    f"{api} ≥ {TARGETS[api]}× the echo-plus-judge baseline (16-member groups)",
                    _spread(r),
                    mark(ok) + ("" if ok else f" ({prof})"),
                ]
            )
    single = out.get("single")
    if single:
        for api in ("SubmitMember", "StreamGroups"):
            r = single["summary"][api]["ratio"]
            ok = r["median"] >= TARGETS["single"]
            rows.append(
                [
                    f"1-member groups, {api} ≥ {TARGETS['single']}× a bare echo",
                    _spread(r),
                    mark(ok) + ("" if ok else f" ({prof})"),
                ]
            )
        on_file = single["summary"]["SubmitMember"].get("ratios", {}).get("service-sqlite")
        if on_file:
            ok = on_file["median"] >= TARGETS["single_sqlite"]
            rows.append(
                [
                    "1-member groups, SubmitMember on the default store (SQLite) ≥ "
                    f"{TARGETS['single_sqlite']}× a bare echo",
                    _spread(on_file),
                    mark(ok) + ("" if ok else " (§2, §5, §11)"),
                ]
            )
    ret = out.get("retained")
    if ret:
        r = ret["ratio_p99"]
        lo, hi = ret["retained"][0], ret["retained"][-1]
        ok = r["median"] <= TARGETS["retained_p99"]
        rows.append(
            [
                f"p99 at {hi:,} retained ≤ 1.2× p99 at {lo:,}",
                _spread(r) + f"; pooled {ret['pooled_ratio_p99']:.2f}×",
                mark(ok),
            ]
        )
    store = out.get("store")
    if store:
        for api in ("SubmitMember", "StreamGroups"):
            r = store["summary"][api]["ratio"]
            ok = r["median"] >= TARGETS["store_ratio"]
            rows.append(
                [
                    f"{api} with the SQLite store ≥ {TARGETS['store_ratio']}× `memory://` "
                    "(16-member groups)",
                    _spread(r),
                    mark(ok) + ("" if ok else " (§5, §11)"),
                ]
            )
        rec = store["recovery"]
        first = rec["summary"]["full"]["first_get_cohort_s"]
        ok = first["median"] < TARGETS["restart_s"]
        rows.append(
            [
                f"restart with {rec['retained']:,} retained + {rec['active']} active cohorts "
                "< 2 s (exec → first answered GetCohort)",
                _spread(first, 2, " s"),
                mark(ok),
            ]
        )
    return rows


# ----------------------------------------------------------------------------- sections
def _side_rows(summary: dict[str, Any], sides: Sequence[str]) -> list[list[str]]:
    rows = []
    for api in ("SubmitMember", "StreamGroups"):
        for side in sides:
            s = summary[api][side]
            rows.append(
                [
                    f"{api} · {side}",
                    _spread(s["members_per_s"], 0, ""),
                    num(s["cpu_us_per_member"]["median"], 0),
                    num(s["cpu_us_per_judge_call"]["median"], 0),
                    num(s["judge_calls_per_member"]["median"], 2),
                    num(s["member_p50_ms"]["median"]),
                    num(s["member_p99_ms"]["median"]),
                ]
            )
    return rows


HEADERS = [
    "API · side",
    "members/s median (min–max)",
    "server CPU µs/member",
    "server CPU µs/judge call",
    "judge calls/member",
    "member p50 ms",
    "member p99 ms",
]


def throughput_section(out: dict[str, Any]) -> str:
    t = out["throughput"]
    plan = out["multi_plan"]
    b = t["bodies"]
    lines = [
        "## 1. Service vs the echo-plus-judge baseline (separate processes)",
        "",
        f"Groups of {plan['group_size']} members ({plan['answer_bytes']:,}-byte answers), "
        f"{plan['in_flight']} groups in flight, {plan['groups']} groups per run, "
        f"{plan['rounds']} rounds; in each round both sides run back to back, the order "
        "alternating (ABAB). The judge is `bench/judge.py` answering at once over HTTP. "
        "The service is `genrm-grpc serve` (circular pairs, `judge_max_concurrency` "
        f"{plan['concurrency']}). The baseline (`bench/baseline.py`) is a bare `grpc.aio` "
        "servicer of the same proto that, when a group is complete, sends the judge the "
        f"same requests (at most {plan['concurrency']} at a time, one aiohttp session) and "
        "then answers every member: the physical limit of this work on this machine.",
        "",
        f"- Same bodies: for one identical group the judge recorded {b['service_requests']} "
        f"requests from the service and {b['baseline_requests']} from the baseline; parsed "
        f"JSON bodies identical: **{'yes' if b['identical'] else 'NO'}**.",
        "",
        md_table(HEADERS, _side_rows(t["summary"], t["sides"])),
        "",
    ]
    for api in ("SubmitMember", "StreamGroups"):
        r = t["summary"][api]["ratio"]
        rounds = ", ".join(f"{x:.2f}" for x in r["rounds"])
        lines.append(
            f"- **{api}: service / baseline = {r['median']:.2f}×** (median of per-round "
            f"ratios; rounds {rounds})."
        )
    return "\n".join(lines)


def single_section(out: dict[str, Any]) -> str:
    t = out["single"]
    plan = out["multi_plan"]
    lines = [
        "## 2. 1-member groups vs a bare echo",
        "",
        f"1-member groups (no judge call; the reward is `default_ranking`), "
        f"{plan['single_in_flight']} in flight, {plan['single_groups']:,} per run, "
        f"{plan['rounds']} rounds, the sides' order reversed every other round. The echo "
        "(`bench/baseline.py --mode echo`) answers each member at once with a result "
        "(StreamGroups: `accepted`, then `result`). `service` runs on `memory://`; "
        "`service-sqlite`, where this run has it, is the same server on the default store "
        "(a fresh SQLite file, `synchronous=FULL`), which writes and commits each cohort's "
        "records before it answers.",
        "",
        md_table(HEADERS, _side_rows(t["summary"], t["sides"])),
        "",
    ]
    for api in ("SubmitMember", "StreamGroups"):
        ratios = t["summary"][api].get("ratios") or {"service": t["summary"][api]["ratio"]}
        for side, r in ratios.items():
            rounds = ", ".join(f"{x:.2f}" for x in r["rounds"])
            lines.append(f"- **{api}: {side} / echo = {r['median']:.2f}×** (rounds {rounds}).")
    return "\n".join(lines)


def saturation_section(out: dict[str, Any]) -> str:
    sat = out["saturation"]
    plan = out["multi_plan"]
    rows = []
    for c in sat["levels"]:
        for side in ("service", "baseline"):
            s = sat["summary"][f"{side}-{c}"]
            rows.append(
                [
                    f"C = {c} · {side}",
                    num(c / (sat["latency_ms"] / 1e3), 0),
                    _spread(s["pairs_per_s"], 0, ""),
                    _spread(s["saturation"]),
                    str(s["max_in_flight"]),
                    num(s["cpu_us_per_judge_call"]["median"], 0),
                    num(
                        statistics.median(
                            r["server_cpu_share"]
                            for r in sat["rows"]
                            if r["c"] == c and r["side"] == side
                        ),
                        2,
                    ),
                ]
            )
    return "\n".join(
        [
            "## 3. Judge saturation",
            "",
            f"The judge answers after L = {sat['latency_ms']:.0f} ms. For each C the service "
            "runs with `judge_max_concurrency` = C (and `judge.max_connections` ≥ C), the "
            "baseline with the same bound; the load generator keeps 3·C pairs' worth of "
            "16-member groups in flight. Judge calls per second are counted by the judge "
            f"over a {plan['sat_window_s']:.0f} s window after {plan['sat_warmup_s']:.0f} s "
            f"of ramp-up; {plan['sat_rounds']} rounds, sides alternating. Max in flight is "
            "the judge's own gauge over the whole run. Server CPU (cores) is the server "
            "process's CPU seconds per second in the window: below 1 while the throughput "
            "is low means the process did not get more of the shared cores. Server CPU per "
            "call is all the server's CPU in the window ÷ the judge calls in it (members' "
            "own work included, as a deployment pays it); the ≤ 300 µs target reads it at "
            "C = 64.",
            "",
            md_table(
                [
                    "C · side",
                    "C/L calls/s",
                    "judge calls/s median (min–max)",
                    "÷ C/L",
                    "max in flight",
                    "server CPU µs/call",
                    "server CPU (cores)",
                ],
                rows,
            ),
            "",
            *cpu_budget(out),
        ]
    )


def cpu_budget(out: dict[str, Any]) -> list[str]:
    """What CPU per judge call each C/L needs, against what this run measured.

    The server's Python work runs on one event loop under one GIL, so one core is the
    most it can use for it; the load generator and the judge share the same two cores.
    """
    sat = out["saturation"]
    lines = ["### CPU budget per judge call", ""]
    rows = []
    for c in sat["levels"]:
        ideal = c / (sat["latency_ms"] / 1e3)
        need = 1e6 / ideal
        cells = [f"C = {c}", num(ideal, 0), num(need, 0)]
        for side in ("service", "baseline"):
            cpu = sat["summary"][f"{side}-{c}"]["cpu_us_per_judge_call"]["median"]
            cells.append(f"{num(cpu, 0)} µs → {num(1e6 / cpu / ideal, 2)}×")
        rows.append(cells)
    lines += [
        md_table(
            [
                "C",
                "C/L calls/s",
                "µs per call that C/L allows on one whole core",
                "service: measured µs/call → ÷ C/L one core would allow",
                "baseline: same",
            ],
            rows,
        ),
        "",
    ]
    single = out.get("single")
    floor = ""
    if single:
        echo = single["summary"]["SubmitMember"]["echo"]["cpu_us_per_member"]["median"]
        floor = (
            f" A bare grpc.aio echo of one SubmitMember costs {num(echo, 0)} µs of server CPU "
            "in this run (§2) before any judge request is sent, and every judge call here "
            "carries one member (circular pairs: one call per member)."
        )
    base64 = sat["summary"].get("baseline-64")
    if base64:
        base = base64["cpu_us_per_judge_call"]["median"]
        floor += (
            " The baseline (bare grpc.aio plus one aiohttp request per call, no cohort "
            f"logic) costs {num(base, 0)} µs per call at C = 64"
            + (
                ": the ≤ 300 µs target is below what this work costs in Python on this "
                "machine in this run, whichever side does it."
                if base > TARGETS["cpu_per_judge_call_us"]
                else "."
            )
        )
    lines.append(
        "At L = 100 ms, C = 256 needs 2,560 calls/s, i.e. at most 390 µs of server CPU per "
        "call (members' work included) even if the server had a whole core to itself; it "
        "cannot use more than about one (one event loop, one GIL), and the load generator "
        "and the judge need their share of the same two cores at that rate." + floor
    )
    return lines


def retained_section(out: dict[str, Any], plots: dict[str, str], rel: str) -> str:
    ret = out["retained"]
    plan = out["multi_plan"]
    lo, hi = ret["retained"][0], ret["retained"][-1]
    rows = []
    for n in ret["retained"]:
        s = ret["per_side"][f"retained-{n}"]
        rows.append(
            [
                f"{n:,}",
                num(ret["prefill_s"][f"retained-{n}"]),
                num(s["member_p50_ms"]["median"]),
                _spread(s["member_p99_ms"], 1, ""),
                num(s["pooled_p99_ms"]),
                num(s["member_max_ms"]["max"]),
                num(s["cpu_us_per_member"]["median"], 0),
            ]
        )
    r = ret["ratio_p99"]
    return "\n".join(
        [
            "## 4. p99 vs retained cohorts (garbage collection)",
            "",
            f"Two servers, one holding {lo:,} and one {hi:,} terminal cohorts "
            "(`max_terminal_cohorts` = that number, so the store is at its cap and every "
            "new cohort evicts one). They are filled through the public API (1-member "
            f"groups over StreamGroups). Then SubmitMember, {plan['group_size']}-member "
            f"groups, only {plan['retained_in_flight']} in flight (so latency shows pauses "
            f"rather than queueing), {plan['retained_groups']} groups per run, "
            f"{plan.get('retained_rounds', plan['rounds'])} rounds ABAB (many short rounds, "
            "so that the other load on the shared machine falls on both sides alike); "
            "instant judge. The target reads the median of the per-round p99 ratios.",
            "",
            md_table(
                [
                    "retained",
                    "fill s",
                    "member p50 ms",
                    "member p99 ms median (min–max)",
                    "pooled p99 ms",
                    "max ms",
                    "server CPU µs/member",
                ],
                rows,
            ),
            "",
            f"- **p99 {hi:,} / {lo:,} = {r['median']:.2f}×** (per-round ratios "
            + ", ".join(f"{x:.2f}" for x in r["rounds"])
            + f"; pooled over rounds {ret['pooled_ratio_p99']:.2f}×).",
            *_pause_note(ret, plan),
            "- Why it is flat: a full collection of the cyclic GC walks every tracked "
            "object. The store keeps each tombstone as one `bytes` record under a plain "
            "tuple key, neither tracked by the GC, so 50,000 retained cohorts add no "
            "object to a collection (before, a packed tombstone was about ten tracked "
            "objects: 500,000 objects and 200–300 ms pauses at 50,000). `genrm-grpc "
            "serve` also freezes its start-up objects (`gc.freeze()`). Objects created "
            "later are not frozen on purpose: one that later died in a reference cycle "
            "would never be freed; raising the gen-2 threshold would only make the same "
            "long pause rarer.",
            *(
                ["", f"![latency CDF vs retained]({rel}/{plots['retained']})"]
                if "retained" in plots
                else []
            ),
        ]
    )


def _pause_note(ret: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """Why a round's p99 is its worst pause, in this run's figures."""
    runs = ret.get("runs", [])
    if not runs:
        return []
    near = sum(1 for r in runs if r["member_p99_ms"] >= 0.9 * r["member_max_ms"])
    p99s = [r["member_p99_ms"] for r in runs]
    in_flight = plan["retained_in_flight"] * plan["group_size"]
    per_round = plan["retained_groups"] * plan["group_size"]
    return [
        f"- In {near} of {len(runs)} runs the p99 is within 10 % of the run's maximum: "
        f"with {in_flight} members in flight one pause (a collection, or the process not "
        f"being scheduled on the shared cores) delays about {in_flight} members, "
        f"{in_flight / per_round:.0%} of a run's {per_round:,}, so a run's p99 is its "
        f"worst pause. Per-run p99s of both sides together range {min(p99s):.0f}–"
        f"{max(p99s):.0f} ms, which is why the ratio is read over many alternating rounds."
    ]


def profile_section(out: dict[str, Any]) -> str:
    prof = out["profile"]
    lines = [
        "## 5. Where the server's CPU goes (py-spy)",
        "",
        "`py-spy record --pid --gil --threads` on the server process at 250 Hz while the "
        "load generator drives it: only samples of the thread holding the GIL, i.e. Python "
        "work (native time inside grpcio's Cython core is charged to the Python line that "
        "called it, e.g. `context.write`, `async for request`). A sample counts for the "
        "judge HTTP client when its stack holds a frame of `genrm_grpc/judge/client.py` (or "
        "of the modules it is split into: `transport.py`, `wire.py`, `attempts.py`, "
        "`checks.py`, `texts.py`, `sse.py`) or of its HTTP library, for the service code "
        "when it holds another project frame.",
        "",
        "Each profile also gives the server's CPU per member by thread over the same run "
        "(`/proc/PID/task/TID/stat`, user and system time) and each thread's share of the "
        "GIL samples. Python threads carry their Python names (`py-spy dump`), the others "
        "the names gRPC core gives them: `MainThread` runs the event loop and everything "
        "the service does in Python; `Thread-1 (_poll_wrapper)` is grpcio's poller of "
        "gRPC core's completion queue; `event_engine` and `grpc_global_tim` are gRPC core's "
        "own threads; `asyncio_0` is the event loop's default executor; "
        "`genrm-sqlite-writer` is the SQLite store's writer (it encodes, writes and commits "
        "what the event loop hands it).",
    ]
    if "error" in prof:
        return "\n".join([*lines, "", f"py-spy failed: {prof['error']}"])
    titles = {
        "SubmitMember": "SubmitMember, 1-member groups",
        "StreamGroups": "StreamGroups, 1-member groups",
        "judge": "SubmitMember, 16-member groups with the instant judge (the judge-call path)",
        "sqlite": "SubmitMember, 1-member groups on the default store (a fresh SQLite file)",
        "sqlite-judge": (
            "SubmitMember, 16-member groups with the instant judge on the default store "
            "(a fresh SQLite file)"
        ),
    }
    for label, p in prof.items():
        lines += ["", f"### {titles.get(label, label)}", ""]
        if "error" in p:
            lines.append(f"py-spy failed: {p['error']}")
            continue
        lines.append(
            f"{p['samples']:,} samples; server CPU {num(p['cpu_us_per_member'], 0)} µs per member."
        )
        lines += [
            "",
            md_table(["where the samples are", "%"], [[c, num(k)] for c, k in p["categories"]]),
            "",
            md_table(
                ["top self (function)", "%", "top project functions (inclusive)", "%"],
                [
                    [
                        s[0] if s else "",
                        num(s[1]) if s else "",
                        i[0] if i else "",
                        num(i[1]) if i else "",
                    ]
                    for s, i in _zip_longest(p["self"][:10], p.get("project", [])[:10])
                ],
            ),
            *_thread_table(p),
        ]
    lines += ["", *profile_findings(out)]
    return "\n".join(lines)


def _thread_table(p: dict[str, Any]) -> list[str]:
    rows = p.get("by_thread")
    if not rows:
        return []
    return [
        "",
        md_table(
            ["thread", "threads", "user µs/member", "system µs/member", "GIL samples %"],
            [
                [
                    r["thread"],
                    str(r["threads"]),
                    num(r["user_us"], 0),
                    num(r["system_us"], 0),
                    num(r["gil_pct"]),
                ]
                for r in rows
            ],
        ),
    ]


def _thread(p: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    return next((r for r in p.get("by_thread", []) if r["thread"].startswith(prefix)), None)


def _share(p: dict[str, Any], prefix: str) -> float:
    return float(sum(k for c, k in p.get("categories", []) if c.startswith(prefix)))


def profile_findings(out: dict[str, Any]) -> list[str]:
    """What the profiles say about each ✘, in figures taken from this run."""
    prof = out["profile"]
    found = ["### What the profiles explain", ""]
    judge = prof.get("judge", {})
    if "categories" in judge:
        client = _share(judge, "judge HTTP client")
        core = _share(judge, "gRPC core")
        own = ", ".join([f"{f} {k}%" for f, k in judge["self"] if "asyncio/" not in f][:4])
        sat = out.get("saturation", {}).get("summary", {})
        gap = ""
        if "service-64" in sat and "baseline-64" in sat:
            svc = sat["service-64"]["cpu_us_per_judge_call"]["median"]
            base = sat["baseline-64"]["cpu_us_per_judge_call"]["median"]
            gap = (
                f" At C = 64 the service spends {num(svc, 0)} µs per judge call and the "
                f"baseline {num(base, 0)} µs for the same requests; the {num(svc - base, 0)} µs "
                "between them is the cohort work the baseline skips (validation, digests, "
                "the registry, the runtime's timers, waiters and per-pair tasks, metrics), "
                "and everything below the baseline's figure is gRPC, asyncio and aiohttp "
                "work that any Python server of this design pays (CPU budget, §3)."
            )
        found.append(
            f"- **Judge calls** (CPU per call, saturation, 16-member throughput): "
            f"{core:.0f}% of the server's Python samples on the judge-call path have no "
            f"project frame (gRPC core and the event loop), {client:.0f}% are the judge "
            f"HTTP client; the top self frames outside asyncio are {own}.{gap}"
            + (
                " The baseline sends the same requests with aiohttp for a fraction of the "
                "CPU (§1, §3): the judge client, not the cohort logic, sets these figures."
                if client >= 50
                else ""
            )
        )
    for api in ("SubmitMember", "StreamGroups"):
        p = prof.get(api, {})
        if "categories" not in p:
            continue
        top = ", ".join(f"{f} {k}%" for f, k in p.get("project", [])[:4])
        found.append(
            f"- **1-member {api}**: {_share(p, 'gRPC core'):.0f}% of the samples have no "
            f"project frame (gRPC core and the event loop), "
            f"{_share(p, 'service code'):.0f}% are in the service code; its top functions "
            f"(inclusive) are {top}."
            + (
                " The self time of `_guard.<locals>.guarded` and `_checked` "
                "(`genrm_grpc/server/interceptors.py`) is grpcio's native stream write "
                "(`await context.write`) and read (`async for request`) charged to those "
                "lines: one write per event (accepted, pair_judged, result)."
                if api == "StreamGroups" and "guarded" in top
                else ""
            )
        )
    found += _sqlite_profile_finding(prof)
    return found + same_work_findings(out)


#: The SQLite profiles and the ``memory://`` profile of the same work.
_SQLITE_PROFILES = (
    ("sqlite", "SubmitMember", "1-member SubmitMember"),
    ("sqlite-judge", "judge", "16-member SubmitMember (judge calls)"),
)


def _sqlite_profile_finding(prof: dict[str, Any]) -> list[str]:
    """What the default store adds, thread by thread, from each SQLite profile and the
    ``memory://`` profile of the same work (run one after the other, not interleaved)."""
    found = []
    for label, same_work, what in _SQLITE_PROFILES:
        on_file = prof.get(label, {})
        loop, writer = _thread(on_file, "MainThread"), _thread(on_file, "genrm-sqlite-writer")
        mem_loop = _thread(prof.get(same_work, {}), "MainThread")
        if not (loop and writer and mem_loop):
            continue
        extra = sum(loop[k] - mem_loop[k] for k in ("user_us", "system_us"))
        found.append(
            f"- **{what} on SQLite**: {on_file['cpu_us_per_member']:.0f} µs of server CPU "
            f"per member. The writer thread used {num(writer['user_us'], 0)} µs of user and "
            f"{num(writer['system_us'], 0)} µs of system time per member and held the GIL in "
            f"{num(writer['gil_pct'])}% of the samples; the event loop's thread used "
            f"{num(loop['user_us'], 0)} and {num(loop['system_us'], 0)} µs, "
            f"{num(abs(extra), 0)} µs {'more' if extra >= 0 else 'less'} than on `memory://` "
            f"in its own run ({num(mem_loop['user_us'], 0)} and "
            f"{num(mem_loop['system_us'], 0)} µs). The two runs were one after the other, "
            "not interleaved: differences of a few tens of µs are within what load on the "
            "shared cores moves."
        )
    return found


def _cpu(summary: dict[str, Any], side: str) -> float:
    return float(summary[side]["cpu_us_per_member"]["median"])


def same_work_findings(out: dict[str, Any]) -> list[str]:
    """For each throughput or saturation ✘: the server CPU of both sides of the same work
    in this run. Every side is CPU-bound on the shared cores, so its throughput follows
    its CPU per member; the difference is the work the other side does not do."""
    found: list[str] = []
    sat = out.get("saturation")
    if sat:
        summary = sat["summary"]
        c = max(sat["levels"])
        svc, base = summary.get(f"service-{c}"), summary.get(f"baseline-{c}")
        if svc and base and svc["saturation"]["median"] < TARGETS["saturation"]:
            ideal = float(c) / (float(sat["latency_ms"]) / 1000)

            def cores(s: dict[str, Any]) -> float:
                calls = float(s["pairs_per_s"]["median"])
                return calls * float(s["cpu_us_per_judge_call"]["median"]) / 1e6

            def allowed(s: dict[str, Any]) -> float:
                return 1e6 / float(s["cpu_us_per_judge_call"]["median"]) / ideal

            found.append(
                f"- **Saturation at C = {c}** ({num(svc['saturation']['median'], 2)}×): the "
                f"server process used {cores(svc):.2f} cores of CPU in the window, i.e. all "
                "that one event loop with one GIL can use: it is CPU-bound, not short of "
                f"concurrency (the judge saw {svc['max_in_flight']} in flight). At "
                f"{num(svc['cpu_us_per_judge_call']['median'], 0)} µs per call one whole core "
                f"allows {allowed(svc):.2f}× of C/L; the baseline, doing the same requests "
                f"without the cohort work, costs {num(base['cpu_us_per_judge_call']['median'], 0)}"
                f" µs per call ({cores(base):.2f} cores), which one core allows to reach "
                f"{allowed(base):.2f}×, and reached {num(base['saturation']['median'], 2)}×."
            )
    both = ("SubmitMember", "StreamGroups")
    pairs = (
        (
            "throughput",
            "service",
            "baseline",
            "16-member groups vs the echo-plus-judge baseline",
            None,
            both,
        ),
        ("single", "service", "echo", "1-member groups vs a bare echo", "single", both),
        (
            "single",
            "service-sqlite",
            "echo",
            "1-member groups on the default store (SQLite) vs a bare echo",
            "single_sqlite",
            ("SubmitMember",),
        ),
        ("store", "sqlite", "memory", "the SQLite store vs `memory://`", "store_ratio", both),
    )
    for section, mine, other, what, key, apis in pairs:
        data = out.get(section)
        if not data:
            continue
        for api in apis:
            summary = data["summary"][api]
            if mine not in summary:
                continue
            ratio = summary.get("ratios", {}).get(mine, summary["ratio"])["median"]
            if ratio >= TARGETS[key or api]:
                continue
            a, b = _cpu(summary, mine), _cpu(summary, other)
            if key == "single_sqlite" and "service" in summary:
                found.append(_default_store_finding(summary, ratio))
                continue
            found.append(
                f"- **{api}, {what}** ({ratio:.2f}×): {num(a, 0)} µs of server CPU per member "
                f"against {num(b, 0)} µs on the other side of the same work in this run, a CPU "
                f"ratio of {b / a:.2f}×: on the two shared cores the server's CPU per member "
                f"sets the pace. The {num(a - b, 0)} µs between them is "
                + (
                    "the store: each member, journaled pass (where the groups have "
                    "any), header, tombstone and watermark written and committed (fsync) "
                    "by the writer thread, which also takes the GIL from the event loop "
                    "(§11; thread by thread: the 16-member SQLite profile above)."
                    if "sqlite" in mine
                    else "the service's own per-member work that the other side skips: "
                    "validation and digests, the registry, waiters"
                    + (
                        ", the per-pair task and journal record, scoring"
                        if section != "single"
                        else ""
                    )
                    + (
                        ", the stream's reader task and writer loop"
                        if api == "StreamGroups"
                        else ""
                    )
                    + ' and the result message (measured without gRPC in "Hot path, '
                    'third round").'
                )
            )
    return found


def _default_store_finding(summary: dict[str, Any], ratio: float) -> str:
    """The default store's 1-member ✘, split into what the service path costs on any store
    (its ``memory://`` side, same rounds) and what the store adds (thread by thread:
    :func:`_sqlite_profile_finding`)."""
    a, m, b = (_cpu(summary, side) for side in ("service-sqlite", "service", "echo"))
    on_memory = summary["ratios"]["service"]["median"]
    store = (
        f"and {num(a - m, 0)} µs is the store: the records of each cohort encoded, written "
        "and committed (fsync) by the writer thread before the member is answered."
        if a >= m
        else f"and the SQLite side used {num(m - a, 0)} µs less than `memory://` in these "
        "rounds: the store's cost is within the rounds' spread here."
    )
    text = (
        f"- **SubmitMember, 1-member groups on the default store (SQLite) vs a bare echo** "
        f"({ratio:.2f}×): {num(a, 0)} µs of server CPU per member against the echo's "
        f"{num(b, 0)} µs in this run, a CPU ratio of {b / a:.2f}×. Of the {num(a - b, 0)} µs "
        f"between them, {num(m - b, 0)} µs is the service's own path, which the same server "
        f"on `memory://` pays as well ({num(m, 0)} µs per member; {on_memory:.2f}× the echo "
        f"in the same rounds), {store}"
    )
    if m - b > a - m:
        missed = on_memory < TARGETS["single"]
        text += (
            " Most of the distance is the service path, not the store"
            + (f": `memory://` misses its own target too ({TARGETS['single']}×)" if missed else "")
            + '; where it goes: the 1-member profiles above and the hand-kept section "The '
            'SQLite write path".'
        )
    return text


def store_section(out: dict[str, Any]) -> str:
    t = out["store"]
    plan = out["multi_plan"]
    rec = t["recovery"]
    served = t["served_file"]
    size = rec["size"]
    lines = [
        "## 11. Durable store: SQLite vs `memory://` (separate processes)",
        "",
        "Two `genrm-grpc serve` processes in the same run, identical but for `GENRM_STORE`: "
        "a fresh SQLite file (`sqlite:///…`, the default kind: WAL, one writer thread, "
        "group commit, `synchronous=FULL`) and `memory://` (nothing written). "
        f"Groups of {plan['group_size']} members ({plan['answer_bytes']:,}-byte answers), "
        f"{plan['in_flight']} groups in flight, {plan['groups']} groups per run, "
        f"{plan['rounds']} rounds ABAB, the instant judge of §1. With SQLite every member "
        "is answered only once it is committed, every journaled pass and the outcome are "
        "written before publication (see docs/durability.md).",
    ]
    if "started_at" in t:
        load = "; ".join(", ".join(f"{x:.2f}" for x in la) for la in t["loadavg"])
        lines += [
            "",
            f"This section was measured from {t['started_at']} (load average 1/5/15 min "
            f"at its start and end: {load}).",
        ]
    lines += [
        "",
        md_table(HEADERS, _side_rows(t["summary"], t["sides"])),
        "",
    ]
    for api in ("SubmitMember", "StreamGroups"):
        r = t["summary"][api]["ratio"]
        rounds = ", ".join(f"{x:.2f}" for x in r["rounds"])
        lines.append(
            f"- **{api}: sqlite / memory = {r['median']:.2f}×** (median of per-round "
            f"ratios; rounds {rounds}; target ≥ {TARGETS['store_ratio']}×)."
        )
    cpu = {
        side: t["summary"]["SubmitMember"][side]["cpu_us_per_member"]["median"]
        for side in t["sides"]
    }
    lines += [
        f"- Server CPU per member (SubmitMember): {num(cpu.get('sqlite'), 0)} µs with SQLite, "
        f"{num(cpu.get('memory'), 0)} µs in memory. Where the difference goes (the writer "
        "thread's steps, the event loop's share, the GIL), measured by hand: the section "
        '"The SQLite write path".',
        "",
        f"**Restart recovery.** A store file holding {rec['retained']:,} retained cohorts "
        "(completed, 16 members, 16 journaled passes each, with their watermarks) and "
        f"{rec['active']} active ones (collecting, 16 members with ~2 KiB of answer text "
        "each), written through `SqliteStore.persist` as a server writes it; then a real "
        '`genrm-grpc serve` process on it, timed from exec to its "serving on" line '
        "(the store is read back before the port is bound) and to the first answered "
        "`GetCohort` (of an active cohort: it answers COLLECTING with its 16 members), "
        f"versus the same on an empty store; {len(rec['restarts']) // 2} restarts each, "
        "ABAB. The process start-up itself (imports, settings, judge probe) is in both.",
        "",
        md_table(
            ["store file", "exec → serving on, s", "exec → first GetCohort, s", "answer"],
            [
                [
                    "empty" if side == "empty" else f"{rec['retained']:,} + {rec['active']}",
                    _spread(rec["summary"][side]["serving_s"], 2, ""),
                    _spread(rec["summary"][side]["first_get_cohort_s"], 2, ""),
                    next(r["answer"] for r in rec["restarts"] if r["side"] == side),
                ]
                for side in ("full", "empty")
            ],
        ),
        "",
        f"- Reading back {rec['retained']:,} + {rec['active']} cohorts adds "
        f"{rec['summary']['full']['first_get_cohort_s']['median'] - rec['summary']['empty']['first_get_cohort_s']['median']:+.2f} s "  # noqa: E501
        "(median vs median) to a restart.",
        "",
        "**Store size per retained cohort.** "
        f"{size['bytes_per_retained_cohort'] / 1024:.1f} KiB per retained 16-member cohort "
        f"(a file of {rec['retained']:,} retained cohorts only: "
        f"{size['file_bytes'] / 2**20:.1f} MiB, tombstone + watermark + 16 journaled "
        "passes each). The SQLite server of the throughput runs above, after its drain, "
        f"held {served['rows']['tombstones']:,} tombstones and "
        f"{served['rows']['verdicts']:,} journaled passes in "
        f"{served['used_bytes'] / 2**20:.1f} MiB of used pages "
        f"({served['used_bytes_per_tombstone'] / 1024:.1f} KiB per retained cohort; the "
        "pages freed by dropped members are reused, the file is "
        f"{served['file_bytes'] / 2**20:.1f} MiB).",
    ]
    return "\n".join(lines)


def _zip_longest(a: Sequence[Any], b: Sequence[Any]) -> list[tuple[Any, Any]]:
    n = max(len(a), len(b))
    return [(a[k] if k < len(a) else None, b[k] if k < len(b) else None) for k in range(n)]


def sections(out: dict[str, Any], plots: dict[str, str], rel: str) -> list[str]:
    parts = []
    if "throughput" in out:
        parts.append(throughput_section(out))
    if "single" in out:
        parts.append(single_section(out))
    if "saturation" in out:
        parts.append(saturation_section(out))
    if "retained" in out:
        parts.append(retained_section(out, plots, rel))
    if "profile" in out:
        parts.append(profile_section(out))
    return parts
