"""The SQLite store on its own: group-commit throughput, recovery time, bytes per cohort.

``python -m bench.store`` builds a store file the way a busy server leaves it — N
retained completed cohorts (16 members, 16 journaled passes each) and M active cohorts
(16 members with realistic answer bodies) — then measures how long start-up takes to
read it back, how large it is per retained cohort, and how many member records per
second the writer thread commits when 64 callers persist at once (``synchronous`` FULL
and NORMAL, interleaved rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from genrm_grpc.cohort.model import (
    CohortKey,
    Completed,
    MemberCoords,
    MemberReward,
    Phase,
    PromptSpec,
    Tombstone,
    comparisons_of,
)
from genrm_grpc.cohort.records import (
    CohortRecord,
    MemberRecord,
    Record,
    TombstoneRecord,
    VerdictRecord,
    WatermarkRecord,
)
from genrm_grpc.scoring.types import AnswerTexts, JudgedPair, Verdict
from genrm_grpc.store.durable import DurableStore
from genrm_grpc.store.sqlite import SqliteStore

GROUP = 16
NOW = 1_900_000_000.0
PROMPT = PromptSpec((("user", "Explain the proof of the lemma in detail. " * 20),), None, None)
ANSWER = AnswerTexts("Let me think step by step. " * 40, "The answer is 42. " * 60)


def _digest(n: int) -> str:
    return f"{n:064x}"


def _completed() -> Completed:
    judged = tuple(JudgedPair(i, (i + 1) % GROUP, 0, Verdict(4.0, 3.0, 2.5)) for i in range(GROUP))
    rewards = tuple(
        MemberReward(3.5, 3.5, 3.5, 0.0, comparisons_of(k, judged)) for k in range(GROUP)
    )
    return Completed(rewards, {"mean_individual_score": 3.5, "std_individual_score": 0.0}, judged)


def _retained(n: int, now: float = NOW) -> list[Record]:
    outcome = _completed()
    records: list[Record] = []
    for c in range(n):
        key = CohortKey(f"group-{c}", None, 0)
        digests = {k: _digest(c * GROUP + k) for k in range(GROUP)}
        records.append(
            TombstoneRecord(Tombstone(key, GROUP, "pd", digests, outcome, now), now + 3600)
        )
        records.append(WatermarkRecord(f"group-{c}", 0, now + 3600))
        records.extend(
            VerdictRecord(
                key,
                key.group_id,
                "c7" * 32,
                digests[i],
                digests[(i + 1) % GROUP],
                0,
                False,
                i,
                (i + 1) % GROUP,
                Verdict(4.0, 3.0, 2.5),
                (2000, 9000, 8000),
                now,
            )
            for i in range(GROUP)
        )
    return records


def _active(m: int, now: float = NOW) -> list[Record]:
    records: list[Record] = []
    for c in range(m):
        key = CohortKey(f"active-{c}", None, 0)
        records.append(CohortRecord(key, c, GROUP, PROMPT, "pd", Phase.COLLECTING, now, now + 1800))
        records.extend(
            MemberRecord(key, MemberCoords(k, key.group_id, 0), _digest(k), ANSWER)
            for k in range(GROUP)
        )
    return records


async def _build(path: Path, retained: int, active: int, now: float = NOW) -> None:
    store = SqliteStore(path)
    await store.open(now)
    records = _retained(retained, now) + _active(active, now)
    for start in range(0, len(records), 5000):
        await store.persist(records[start : start + 5000])
    await store.close()


async def _recover(path: Path) -> tuple[float, int, int]:
    store = SqliteStore(path)
    started = time.perf_counter()
    recovered = await store.open(NOW)
    elapsed = time.perf_counter() - started
    await store.close()
    return elapsed, len(recovered.tombstones), len(recovered.cohorts)


def member_queue(members: int, prefix: str) -> list[MemberRecord]:
    """``members`` member records of 16-member cohorts named ``{prefix}-{n}``."""
    return [
        MemberRecord(
            CohortKey(f"{prefix}-{n // GROUP}", None, 0),
            MemberCoords(n % GROUP),
            _digest(n),
            ANSWER,
        )
        for n in range(members)
    ]


async def persist_one_by_one(
    store: DurableStore, queue: Sequence[MemberRecord], callers: int
) -> dict[str, float]:
    """``callers`` concurrent callers persist ``queue`` one record per call, each call
    awaited as a member's answer would be: throughput and per-call latency."""
    latencies: list[float] = []
    members = len(queue)

    async def caller(offset: int) -> None:
        for n in range(offset, members, callers):
            started = time.perf_counter()
            await store.persist([queue[n]])
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(callers)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "records_per_s": members / elapsed,
        "p50_ms": 1000 * latencies[members // 2],
        "p99_ms": 1000 * latencies[int(members * 0.99)],
    }


async def _throughput(path: Path, synchronous: str, members: int, callers: int) -> dict[str, float]:
    store = SqliteStore(path, synchronous=synchronous)
    await store.open(NOW)
    figures = await persist_one_by_one(store, member_queue(members, "t"), callers)
    commits = store.stats.commits
    await store.close()
    return {**figures, "batches_per_commit": members / max(commits, 1)}


def build(path: Path, retained: int, active: int, now: float) -> None:
    """Write a store file as a busy server leaves it (records stamped at wall time
    ``now``): ``retained`` completed 16-member cohorts with their 16 journaled passes,
    ``active`` collecting 16-member cohorts with realistic answer bodies."""
    asyncio.run(_build(path, retained, active, now))


def _file_bytes(folder: Path) -> int:
    """The database with its WAL and shared-memory files (after a checkpointing close)."""
    return sum(p.stat().st_size for p in folder.glob("state.sqlite3*"))


async def run(
    retained: int, active: int, members: int, callers: int, rounds: int
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.sqlite3"
        await _build(path, retained, active)
        size = _file_bytes(Path(tmp))
        recoveries = [await _recover(path) for _ in range(rounds)]
        modes: dict[str, list[dict[str, float]]] = {"FULL": [], "NORMAL": []}
        for r in range(rounds):
            for mode in ("FULL", "NORMAL") if r % 2 == 0 else ("NORMAL", "FULL"):
                modes[mode].append(
                    await _throughput(Path(tmp) / f"t-{mode}-{r}.sqlite3", mode, members, callers)
                )
    times = [r[0] for r in recoveries]
    return {
        "retained": retained,
        "active": active,
        "recovery_s": {"median": statistics.median(times), "min": min(times), "max": max(times)},
        "recovered": {"tombstones": recoveries[0][1], "active": recoveries[0][2]},
        "bytes_per_retained_cohort": size / max(retained, 1),
        "file_bytes": size,
        "persist": {
            mode: {
                key: {
                    "median": statistics.median(s[key] for s in samples),
                    "min": min(s[key] for s in samples),
                    "max": max(s[key] for s in samples),
                }
                for key in samples[0]
            }
            for mode, samples in modes.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--retained", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=100)
    parser.add_argument(
        "--members", type=int, default=4096, help="member records persisted per round"
    )
    parser.add_argument("--callers", type=int, default=64, help="concurrent persist callers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args.retained, args.active, args.members, args.callers, args.rounds))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
