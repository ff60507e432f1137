"""Memory per active cohort and per tombstone, each measured in a fresh interpreter.

``python -m bench.memory {active|tombstone} {tracemalloc|rss} COUNT`` prints one JSON
object. ``active``: COUNT cohorts of 16 members with 4 KiB answers, all members in,
every judge call pending (the peak state: members, waiters, timers, pair tasks).
``tombstone``: COUNT cohorts run to completion with an instant judge, so the store
holds COUNT tombstones (+ one attempt watermark each). Both go through
``ReplicaRuntime.submit`` over the in-process group store, as the servicer does (gRPC
per-call buffers are not counted).

``tracemalloc`` counts the bytes Python allocated and still holds (deterministic for a
given interpreter); ``rss`` is the resident-set delta (includes allocator slack).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

from bench.service import FIXED_VERDICT, InstantJudge, answer_text
from bench.util import rss_bytes
from genrm_grpc.cohort.identity import CandidateInput, resolve
from genrm_grpc.cohort.model import CohortKey, MemberCoords, PromptSpec, Submission, Tombstone
from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeInput, JudgeOutcome
from genrm_grpc.runtime.clock import LoopClock, WallClock
from genrm_grpc.runtime.live import Ticket
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.store.local import LocalGroups

GROUP_SIZE = 16
ANSWER_BYTES = 4096
LONG = 1e7


class BlockedJudge:
    """Never answers while measuring: every cohort stays evaluating."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        await self.release.wait()
        return JudgeOutcome(verdict=FIXED_VERDICT, usage=None, attempts=1)


async def make_runtime(judge: Any, retained: int) -> ReplicaRuntime:
    """The server's runtime for ``memory://``: the in-process group store, nothing behind."""
    settings = Settings(
        cohort_collection_timeout_s=LONG,
        cohort_evaluation_timeout_s=LONG,
        max_active_cohorts=10**6,
        cohort_result_ttl_s=LONG,
        max_terminal_cohorts=max(retained, 1),
        comparison_strategy="circular",
        default_principle="",  # as measured before the settings views
    )
    clock = WallClock()
    shared = LocalGroups(
        settings,
        lease_s=settings.replica_lease_s,
        behind=None,
        address="memory://",
        clock=clock,
        lease_clock=LoopClock(),
    )
    runtime = ReplicaRuntime(judge, settings, shared=shared, clock=clock)
    await runtime.open()
    return runtime


def submission(n: int, i: int) -> Submission:
    prompt = PromptSpec(
        messages=(
            ("system", "You are a careful assistant."),
            ("user", f"Question {n}: explain the reasoning step."),
        )
    )
    sub = resolve(
        MemberCoords(rollout_index=i, group_id=f"g-{n}", group_attempt=0, group_size=GROUP_SIZE),
        prompt,
        CandidateInput(output_text=answer_text(n, i, ANSWER_BYTES)),
        default_group_size=GROUP_SIZE,
        mode="rollout_cohort",
    )
    assert isinstance(sub, Submission), sub
    return sub


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def measure(kind: str, count: int, sample: Callable[[], int]) -> dict[str, Any]:
    judge: Any = BlockedJudge() if kind == "active" else InstantJudge()
    runtime = await make_runtime(judge, retained=count + 10)
    # Warm up code paths and caches (one cohort, then gone) before the baseline.
    warm = await make_runtime(InstantJudge(), retained=10)
    await asyncio.gather(*(warm.submit(submission(-1, i)) for i in range(GROUP_SIZE)))
    await settle()
    await warm.shutdown(0.0)
    del warm
    tickets: list[asyncio.Task[Ticket]] = []
    gc.collect()
    await settle()
    before = sample()
    for n in range(count):
        # The waiting handlers hold their tickets (every member is in before one returns).
        members = (submission(n, i) for i in range(GROUP_SIZE))
        cohort = [asyncio.ensure_future(runtime.submit(m)) for m in members]
        await asyncio.gather(*cohort)
        if kind == "active":
            tickets.extend(cohort)
        if kind == "tombstone" and n % 64 == 63:
            await settle()
    await settle()
    gc.collect()
    after = sample()
    census = await runtime.refresh_census()
    counts = {"tombstones": census.tombstones, "watermarks": census.watermarks}
    stats = runtime.stats()
    if kind == "active":
        if stats["live_cohorts"] != count:
            raise RuntimeError(f"expected {count} live cohorts, got {stats}")
    elif counts.get("tombstones") != count:
        raise RuntimeError(f"expected {count} tombstones, got {counts}")
    out: dict[str, Any] = {
        "kind": kind,
        "count": count,
        "bytes_total": after - before,
        "bytes_per_item": (after - before) / count,
        "store_counts": counts,
        "runtime_stats": stats,
    }
    if kind == "tombstone":
        key = CohortKey(group_id="g-0", legacy_key=None, attempt=0)
        shared = runtime.shared
        assert isinstance(shared, LocalGroups)
        held = shared.state.unexpired_tombstone(key, runtime.now())
        if held is not None:
            out["deep_size_breakdown"] = breakdown(held.tombstone)
    if kind == "active":
        if isinstance(judge, BlockedJudge):
            judge.release.set()
        await runtime.shutdown(0.0)
    return out


def deep_size(obj: object, seen: set[int]) -> int:
    """sys.getsizeof over the object graph (each object once; interned scalars too)."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, str | bytes | int | float | bool) or obj is None:
        return size
    if isinstance(obj, dict):
        return size + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return size + sum(deep_size(v, seen) for v in obj)
    slots = getattr(type(obj), "__slots__", ())
    for name in slots:
        if hasattr(obj, name):
            size += deep_size(getattr(obj, name), seen)
    if hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def breakdown(tomb: Tombstone) -> dict[str, int]:
    """Bytes of one tombstone object by slot (the packed form, not the rebuilt values), and
    of the ``record()`` bytes the store keeps instead of the object."""
    seen: set[int] = {id(tomb)}
    out = {"object": sys.getsizeof(tomb)}
    for name in type(tomb).__slots__:
        value = getattr(tomb, name)
        inner = getattr(type(value), "__slots__", None)
        if name == "_outcome" and inner:
            seen.add(id(value))
            out["_outcome"] = sys.getsizeof(value)
            for part in inner:
                if hasattr(value, part):
                    out[f"_outcome.{part}"] = deep_size(getattr(value, part), seen)
        else:
            out[name] = deep_size(value, seen)
    out["total"] = sum(out.values())
    # What the store really keeps: one bytes record (see Tombstone.record); not in total.
    out["stored record"] = sys.getsizeof(tomb.record())
    return out


def main(argv: list[str]) -> int:
    kind, method, count = argv[0], argv[1], int(argv[2])
    # Shutting the blocked cohorts down fails them; that is expected, not news.
    logging.getLogger("genrm_grpc").setLevel(logging.CRITICAL)
    if method == "tracemalloc":
        tracemalloc.start()

        def sample() -> int:
            return tracemalloc.get_traced_memory()[0]

    else:
        sample = rss_bytes
    result = asyncio.run(measure(kind, count, sample))
    result["method"] = method
    print(json.dumps(result))
    return 0


def run_isolated(kind: str, method: str, count: int) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter and return its JSON."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.memory", kind, method, str(count)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
