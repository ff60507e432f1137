"""The collect run: plan groups, stream them with bounded concurrency, write the outputs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import (
    ChannelOptions,
    CohortClient,
    CohortConnectError,
    CohortError,
    RetryPolicy,
    new_group_id,
)
from google.protobuf.json_format import MessageToDict

from genrm_grpc.collect.outputs import (
    RESUBMIT_AS_NEW_ATTEMPT,
    OutputPaths,
    PriorState,
    append_lines,
    compact_failures,
    compute_metrics,
    dumps,
    load_prior_state,
    write_atomic,
)
from genrm_grpc.collect.progress import Progress
from genrm_grpc.collect.rows import BadRow, Group, form_groups, parse_lines

__all__ = ["EXIT_CANNOT_CONNECT", "FAILURE_CLASSES", "CollectConfig", "run"]

#: Exit code when no server answered at ``--server``: nothing submitted, no output written.
EXIT_CANNOT_CONNECT = 3

FAILURE_CLASSES = (
    "judge_failed",
    "cohort_failed",
    "invalid",
    "incomplete_group",
    "transport_error",
    "bad_row",
)


@dataclass
class CollectConfig:
    server: str
    input: Path
    output: Path
    concurrency: int = 8
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    zero_classes: frozenset[str] = frozenset()
    group_size: int | None = None
    timeout_s: float = 3600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_group_attempts: int = 1
    channel: ChannelOptions = field(default_factory=ChannelOptions)
    progress: bool | None = None
    """None: a live line when stderr is a terminal, one line per group otherwise."""
    quiet: bool = False


class UsageError(Exception):
    pass


def _coords(
    group: Group, gid: str, attempt: int, index: int, run_id: int | None = None
) -> dict[str, Any]:
    coords: dict[str, Any] = {
        "_ng_group_id": gid,
        "_ng_group_attempt": attempt,
        "_ng_rollout_index": index,
        "_ng_group_size": group.size,
        "_ng_group_key": group.key,
    }
    if group.task_index is not None:
        coords["_ng_task_index"] = group.task_index
    if run_id is not None:
        coords["_ng_run"] = run_id
    return coords


def _verdicts(result: pb.MemberResult) -> list[dict[str, Any]]:
    return [
        MessageToDict(
            v, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        for v in result.comparisons
    ]


class Collector:
    def __init__(self, config: CollectConfig, paths: OutputPaths, run_id: int) -> None:
        self.config, self.paths, self.run_id = config, paths, run_id
        self.results_fh: IO[str] | None = None
        self.failures_fh: IO[str] | None = None
        self.journal_fh: IO[str] | None = None
        self.counters: dict[str, int] = {
            "groups_submitted": 0,
            "groups_ok": 0,
            "groups_failed": 0,
            "groups_replayed": 0,
            "judge_comparisons": 0,
        }

    def open(self) -> None:
        self.results_fh = self.paths.results.open("a", encoding="utf-8")
        self.failures_fh = self.paths.failures.open("a", encoding="utf-8")
        self.journal_fh = self.paths.journal.open("a", encoding="utf-8")

    def close(self) -> None:
        for handle in (self.results_fh, self.failures_fh, self.journal_fh):
            if handle is not None:
                handle.close()

    def journal(self, group: Group, gid: str, attempt: int) -> None:
        assert self.journal_fh is not None
        append_lines(self.journal_fh, [{"key": group.key, "group_id": gid, "attempt": attempt}])

    def fail_group(
        self,
        group: Group,
        gid: str | None,
        attempt: int,
        klass: str,
        reason: str,
        error: CohortError | None = None,
    ) -> None:
        assert self.failures_fh is not None
        records = []
        for row, index in zip(group.rows, group.indices, strict=True):
            rec = dict(row.data)
            rec.update(_coords(group, gid or "", attempt, index, self.run_id))
            if gid is None:
                rec.pop("_ng_group_id")
                if row.data.get("_ng_group_id") is not None:
                    rec["_ng_group_id"] = row.data["_ng_group_id"]
            rec["_ng_line"] = row.line
            rec["_ng_failure_class"] = klass
            rec["_ng_failure_reason"] = reason[:2000]
            if error is not None:
                rec["_ng_failure_code"] = error.code.name
                rec["_ng_failure_error_reason"] = error.reason
            if klass == "judge_failed":
                rec["mask_sample"] = True
            records.append(rec)
        append_lines(self.failures_fh, records)

    def bad_rows(self, bad: Sequence[BadRow]) -> None:
        assert self.failures_fh is not None
        append_lines(
            self.failures_fh,
            [
                {
                    "_ng_failure_class": "bad_row",
                    "_ng_line": b.line,
                    "_ng_failure_reason": b.reason,
                    "_ng_raw": b.raw,
                    "_ng_run": self.run_id,
                }
                for b in bad
            ],
        )

    def write_results(self, group: Group, results: list[pb.MemberResult]) -> None:
        assert self.results_fh is not None
        by_index = {r.member.rollout_index: r for r in results}
        lines = []
        for row, index in zip(group.rows, group.indices, strict=True):
            r = by_index[index]
            out = dict(row.data)
            out.update(
                {
                    "reward": r.reward,
                    "reward_score_raw": r.reward_score_raw,
                    "reward_overall_score_raw": r.reward_overall_score_raw,
                    "reward_overall_score": r.reward_overall_score,
                    "reward_length_adjustment": r.reward_length_adjustment,
                    "group_metrics": dict(r.group_metrics),
                    "comparisons": _verdicts(r),
                    "replayed": r.replayed,
                }
            )
            out.update(_coords(group, r.member.group_id, r.member.group_attempt, index))
            lines.append(out)
        append_lines(self.results_fh, lines)

    async def run_group(
        self, client: CohortClient, group: Group, gid: str, attempt: int, progress: Progress
    ) -> None:
        self.journal(group, gid, attempt)
        self.counters["groups_submitted"] += 1
        prompt = pb.Prompt(messages=[pb.ChatMessage(role=r, content=c) for r, c in group.messages])
        if group.principle is not None:
            prompt.principle = group.principle
        candidates = [
            pb.Candidate(responses_api_json=json.dumps(row.response, ensure_ascii=False))
            for row in group.rows
        ]
        latest = attempt

        async def regenerate(new_attempt: int) -> list[pb.Candidate]:
            nonlocal latest
            latest = new_attempt
            self.journal(group, gid, new_attempt)  # before the replacement is sent
            return candidates

        progress.in_flight += 1
        progress.show()
        try:
            results = await client.evaluate_group_all(
                prompt,
                candidates,
                group_id=gid,
                attempt=attempt,
                group_size=group.size,
                rollout_indices=group.indices,
                task_index=group.task_index,
                timeout=self.config.timeout_s,
                max_group_attempts=self.config.max_group_attempts,
                regenerate=regenerate if self.config.max_group_attempts > 1 else None,
            )
        except CohortError as exc:
            klass = _class_of(exc)
            self.fail_group(group, gid, latest, klass, str(exc), exc)
            self.counters["groups_failed"] += 1
            progress.failed += 1
        else:
            self._finished(group, gid, results, progress)
        finally:
            progress.in_flight -= 1
            progress.show()

    def _finished(
        self, group: Group, gid: str, results: list[pb.MemberResult], progress: Progress
    ) -> None:
        """A group the server answered: its rewards written, or masked as judge_failed."""
        masked = [r for r in results if r.mask_sample]
        if masked:
            reason = masked[0].failure_reason or "the judge failed"
            self.fail_group(group, gid, results[0].member.group_attempt, "judge_failed", reason)
            self.counters["groups_failed"] += 1
            progress.failed += 1
            return
        self.write_results(group, results)
        self.counters["groups_ok"] += 1
        progress.done += 1
        if all(r.replayed for r in results):
            self.counters["groups_replayed"] += 1
        else:
            self.counters["judge_comparisons"] += len(
                {
                    (v.response_i, v.response_j, v.judge_index)
                    for r in results
                    for v in r.comparisons
                }
            )


def _class_of(exc: CohortError) -> str:
    if exc.code == grpc.StatusCode.ABORTED:
        return "cohort_failed"
    if exc.code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
    ):
        return "invalid"
    return "transport_error"


def _plan(group: Group, prior: PriorState) -> tuple[str, int]:
    """The group id and attempt to submit: recorded ids are reused; failures bump."""
    gid = group.explicit_id or prior.ids.get(group.key) or new_group_id("collect-")
    attempt = max(group.file_attempt, prior.attempts.get(group.key, 0))
    failed = prior.failed.get(group.key)
    if failed is not None and failed[1] in RESUBMIT_AS_NEW_ATTEMPT:
        attempt = max(attempt, failed[0] + 1)
    return gid, attempt


def _say(config: CollectConfig, text: str) -> None:
    if not config.quiet:
        print(text, file=sys.stderr, flush=True)


async def run(config: CollectConfig) -> int:
    """Run one collection; returns the exit code (0 ok, 1 no usable reward, 2 usage,
    3 no server answered at ``config.server`` within the connect deadline)."""
    started = time.monotonic()
    paths = OutputPaths.for_output(config.output)
    if not config.input.exists():
        raise UsageError(f"input file {config.input} does not exist")
    existing = [p for p in paths.all() if p.exists()]
    if existing and not (config.resume or config.overwrite):
        raise UsageError(f"{existing[0]} exists; pass --resume to continue that run or --overwrite")
    with config.input.open(encoding="utf-8") as handle:
        rows, bad, row_count = parse_lines(handle)
    groups, superseded = form_groups(rows, config.group_size)
    bad = sorted([*bad, *superseded], key=lambda b: b.line)
    for b in bad:
        _say(config, f"{config.input}:{b.line}: bad row: {b.reason}")
    if bad and config.strict:
        _say(config, f"genrm-grpc collect: {len(bad)} bad row(s) and --strict: nothing submitted")
        return 2
    progress = Progress(0, config.progress, sys.stderr)
    if config.quiet and config.progress is None:
        progress.enabled = False
    ticker = asyncio.create_task(progress.tick())
    client: CohortClient | None = None
    # --resume reads (and repairs) the earlier run first: a finished run needs no server.
    prior = load_prior_state(paths) if config.resume else PriorState()
    try:
        if any(g.problem is None and g.key not in prior.complete for g in groups):
            # Connect before any output is touched: a wrong address costs seconds, and the
            # next run needs neither --resume nor --overwrite.
            client = CohortClient(
                config.server,
                options=config.channel,
                retry=config.retry,
                default_timeout_s=config.timeout_s,
            )
            progress.set_status(f"connecting to {config.server}…")
            try:
                await client.connect()
            except CohortConnectError as exc:
                progress.finish()
                print(
                    f"genrm-grpc collect: {exc.message} (is the server running there? "
                    "--wait-for-server waits for one that is starting); nothing submitted",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_CANNOT_CONNECT
            progress.set_status(None)
        return await _collect(
            config, paths, existing, groups, bad, row_count, started, client, progress, prior
        )
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        if client is not None:
            await client.close()


async def _collect(
    config: CollectConfig,
    paths: OutputPaths,
    existing: list[Path],
    groups: list[Group],
    bad: list[BadRow],
    row_count: int,
    started: float,
    client: CohortClient | None,
    progress: Progress,
    prior: PriorState,
) -> int:
    if config.overwrite and not config.resume:
        for p in existing:
            p.unlink()
    config.output.parent.mkdir(parents=True, exist_ok=True)
    run_id = int(time.time() * 1000)
    collector = Collector(config, paths, run_id)
    collector.open()
    skipped = 0
    try:
        collector.bad_rows(bad)
        todo, skipped = _triage(config, collector, groups, prior)
        if skipped:
            _say(config, f"resume: {skipped} group(s) already complete in {paths.results}")
        progress.total = len(todo)
        if todo:
            assert client is not None  # connected above: there are groups to submit
            await _submit_all(config, client, collector, todo, progress)
        progress.finish()
    finally:
        collector.close()
    compact_failures(paths)
    this_run = {
        "rows_read": row_count,
        "bad_rows": len(bad),
        "groups_in_file": len(groups),
        "groups_skipped_complete": skipped,
        **collector.counters,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    return _summarise(config, paths, this_run)


def _triage(
    config: CollectConfig, collector: Collector, groups: list[Group], prior: PriorState
) -> tuple[list[tuple[Group, str, int]], int]:
    """The groups to submit (with id and attempt) and how many are already complete;
    groups the file itself makes unusable are recorded as failures."""
    todo: list[tuple[Group, str, int]] = []
    skipped = 0
    for group in groups:
        if group.key in prior.complete:
            skipped += 1
        elif group.problem is not None:
            klass, reason = group.problem
            collector.fail_group(group, group.explicit_id, group.file_attempt, klass, reason)
            _say(config, f"group {group.key}: {klass}: {reason}")
        else:
            gid, attempt = _plan(group, prior)
            todo.append((group, gid, attempt))
    return todo, skipped


def _summarise(config: CollectConfig, paths: OutputPaths, this_run: dict[str, Any]) -> int:
    """Write the metrics file, say the summary line; the exit code (1: no usable reward)."""
    metrics = compute_metrics(paths, config.zero_classes, this_run)
    write_atomic(paths.metrics, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    reward = metrics["reward"]
    _say(
        config,
        f"usable rewards {metrics['usable_rewards']}, "
        f"failures {dumps(metrics['failure_rows_by_class'])}, "
        f"mean reward {_fmt(reward['mean'])} (n={reward['count']}) → {paths.results}",
    )
    if reward["count"] == 0:
        _say(config, "genrm-grpc collect: no usable reward")
        return 1
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


async def _submit_all(
    config: CollectConfig,
    client: CohortClient,
    collector: Collector,
    todo: list[tuple[Group, str, int]],
    progress: Progress,
) -> None:
    queue: asyncio.Queue[tuple[Group, str, int]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)

    async def worker() -> None:
        while True:
            try:
                group, gid, attempt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await collector.run_group(client, group, gid, attempt, progress)

    async with asyncio.TaskGroup() as tasks:
        for _ in range(min(config.concurrency, len(todo))):
            tasks.create_task(worker())
