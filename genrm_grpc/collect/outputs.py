"""The collector's files: results, failures sidecar, metrics, and the group journal.

Every write is an append of whole lines followed by a flush (one ``write`` per group), so
a killed collector leaves at most one truncated last line, which readers skip. Files
that are rewritten (compaction, metrics) are written to a temporary file and renamed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "RESUBMIT_AS_NEW_ATTEMPT",
    "OutputPaths",
    "PriorState",
    "append_lines",
    "compact_failures",
    "compute_metrics",
    "load_prior_state",
    "read_jsonl",
    "write_atomic",
]

RESUBMIT_AS_NEW_ATTEMPT = frozenset({"judge_failed", "cohort_failed"})
"""Failure classes that ``--resume`` re-submits as ``group_attempt + 1``."""


@dataclass(frozen=True)
class OutputPaths:
    results: Path
    failures: Path
    metrics: Path
    journal: Path

    @classmethod
    def for_output(cls, output: Path) -> OutputPaths:
        stem = output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name
        base = output.with_name(stem)
        return cls(
            results=output,
            failures=base.with_name(f"{stem}.failures.jsonl"),
            metrics=base.with_name(f"{stem}.metrics.json"),
            journal=base.with_name(f"{stem}.groups.jsonl"),
        )

    def all(self) -> tuple[Path, ...]:
        return (self.results, self.failures, self.metrics, self.journal)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a file; a truncated or garbled line (a crash) is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.endswith("\n"):
                return  # truncated last line
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def append_lines(handle: IO[str], objs: Iterable[object]) -> None:
    text = "".join(dumps(o) + "\n" for o in objs)
    if text:
        handle.write(text)
        handle.flush()


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def ensure_line_boundary(path: Path) -> None:
    """Cut a truncated last line so that appends start on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with path.open("r+b") as handle:
            handle.truncate(cut)


@dataclass
class PriorState:
    """What earlier runs left: minted ids, attempts, complete groups, failure classes."""

    ids: dict[str, str] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    complete: set[str] = field(default_factory=set)
    failed: dict[str, tuple[int, str]] = field(default_factory=dict)
    """group key → (attempt, failure class) of the newest failure record."""


def _complete_groups(rows: list[dict[str, Any]]) -> set[str]:
    slots: dict[tuple[str, int], set[int]] = defaultdict(set)
    sizes: dict[tuple[str, int], int] = {}
    for row in rows:
        key, attempt = row.get("_ng_group_key"), row.get("_ng_group_attempt")
        index, size = row.get("_ng_rollout_index"), row.get("_ng_group_size")
        if isinstance(key, str) and isinstance(attempt, int) and isinstance(index, int):
            slots[(key, attempt)].add(index)
            if isinstance(size, int):
                sizes[(key, attempt)] = size
    return {
        key
        for (key, attempt), present in slots.items()
        if len(present) >= sizes.get((key, attempt), math.inf)
    }


def load_prior_state(paths: OutputPaths) -> PriorState:
    """Read the journal and outputs; drop partial groups and truncated lines from results."""
    state = PriorState()
    for entry in read_jsonl(paths.journal):
        key, gid, attempt = entry.get("key"), entry.get("group_id"), entry.get("attempt")
        if isinstance(key, str) and isinstance(gid, str) and isinstance(attempt, int):
            state.ids[key] = gid
            state.attempts[key] = max(attempt, state.attempts.get(key, 0))
    rows = list(read_jsonl(paths.results))
    complete = _complete_groups(rows)
    kept = [r for r in rows if r.get("_ng_group_key") in complete]
    if paths.results.exists() and len(kept) != sum(1 for _ in _raw_lines(paths.results)):
        # A crash left a partial group or a truncated line: keep whole groups only, so
        # a resubmission (which replays) does not duplicate rows.
        write_atomic(paths.results, "".join(dumps(r) + "\n" for r in kept))
    state.complete = complete
    for rec in read_jsonl(paths.failures):
        key, attempt, klass = (
            rec.get("_ng_group_key"),
            rec.get("_ng_group_attempt"),
            rec.get("_ng_failure_class"),
        )
        if (
            isinstance(key, str)
            and isinstance(attempt, int)
            and isinstance(klass, str)
            and (key not in state.failed or attempt >= state.failed[key][0])
        ):
            state.failed[key] = (attempt, klass)
    ensure_line_boundary(paths.failures)
    ensure_line_boundary(paths.journal)
    return state


def _raw_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        yield from (line for line in handle if line.strip())


def compact_failures(paths: OutputPaths) -> None:
    """Keep only current failures: none for complete groups, newest run per identity."""
    records = list(read_jsonl(paths.failures))
    if not records and not paths.failures.exists():
        return
    complete = _complete_groups(list(read_jsonl(paths.results)))

    def identity(rec: dict[str, Any]) -> str:
        key = rec.get("_ng_group_key")
        return f"group:{key}" if isinstance(key, str) else f"line:{rec.get('_ng_line')}"

    newest_run: dict[str, int] = {}
    for position, rec in enumerate(records):
        run = rec.get("_ng_run")
        newest_run[identity(rec)] = run if isinstance(run, int) else position
    kept = [
        rec
        for position, rec in enumerate(records)
        if rec.get("_ng_group_key") not in complete
        and newest_run[identity(rec)]
        == (rec.get("_ng_run") if isinstance(rec.get("_ng_run"), int) else position)
    ]
    write_atomic(paths.failures, "".join(dumps(r) + "\n" for r in kept))


def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.pstdev(values),
        "min": min(values),
        "max": max(values),
    }


def compute_metrics(
    paths: OutputPaths, zero_classes: frozenset[str], run: dict[str, Any]
) -> dict[str, Any]:
    """Metrics over the final files (all runs); ``run`` adds this run's counters."""
    results = list(read_jsonl(paths.results))
    failures = list(read_jsonl(paths.failures))
    rewards = [float(r["reward"]) for r in results if isinstance(r.get("reward"), int | float)]
    rows_by_class: Counter[str] = Counter()
    groups_by_class: dict[str, set[str]] = defaultdict(set)
    for rec in failures:
        klass = str(rec.get("_ng_failure_class", "unknown"))
        rows_by_class[klass] += 1
        key = rec.get("_ng_group_key")
        groups_by_class[klass].add(key if isinstance(key, str) else f"line:{rec.get('_ng_line')}")
    zero_counted = sum(
        n for klass, n in rows_by_class.items() if klass in zero_classes and klass != "bad_row"
    )
    metric_inputs = rewards + [0.0] * zero_counted
    verdicts: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    parse_failed: dict[str, set[tuple[int, int, int]]] = defaultdict(set)
    token_totals: dict[str, float] = defaultdict(float)
    seen_groups: set[str] = set()
    for row in results:
        key = str(row.get("_ng_group_key"))
        for v in row.get("comparisons") or []:
            ident = (int(v["response_i"]), int(v["response_j"]), int(v["judge_index"]))
            verdicts[key].add(ident)
            if v.get("parse_failed"):
                parse_failed[key].add(ident)
        if key not in seen_groups:
            seen_groups.add(key)
            for name, value in (row.get("group_metrics") or {}).items():
                if name.startswith("judge_") and name.endswith("_total"):
                    token_totals[name] += float(value)
    masked = rows_by_class.get("judge_failed", 0)
    return {
        "usable_rewards": len(rewards),
        "reward": _stats(metric_inputs),
        "reward_usable_only": _stats(rewards),
        "zero_counted_classes": sorted(zero_classes),
        "zero_counted_rows": zero_counted,
        "groups_completed": len(seen_groups),
        "failure_rows_by_class": dict(sorted(rows_by_class.items())),
        "failure_groups_by_class": {k: len(v) for k, v in sorted(groups_by_class.items())},
        "masked_rows": masked,
        "masked_rate": masked / (len(rewards) + masked) if rewards or masked else 0.0,
        "judge_comparisons": sum(len(v) for v in verdicts.values()),
        "judge_parse_failures": sum(len(v) for v in parse_failed.values()),
        "judge_tokens": dict(sorted(token_totals.items())),
        "this_run": run,
    }
