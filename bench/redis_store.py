"""The Redis store on its own: group-commit throughput, round trips, recovery time.

``python -m bench.redis_store`` starts a real redis-server on a free loopback port (or
uses ``--url``, a Redis of your own: it writes and then deletes only keys under its own
prefix, in the URL's database and the next one), fills it the way a busy deployment
leaves it — N retained completed cohorts (tombstone, watermark and 16 journaled passes
each) and M active cohorts (16 members with realistic answer bodies), the same data as
``python -m bench.store`` — then measures:

- how long ``open`` takes to read it back, and in how many round trips;
- Redis memory per retained cohort (``used_memory`` before and after);
- how many member records per second the writer commits when 64 callers persist one
  member each at once, and how many round trips that costs per member, under three
  persistence settings of the same server (no AOF, ``appendfsync everysec``,
  ``appendfsync always``; interleaved rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis

from bench.store import NOW, _active, _retained, member_queue, persist_one_by_one
from genrm_grpc.cohort.records import VerdictRecord
from genrm_grpc.store.redis import RedisStore
from genrm_grpc.testing.redis_server import RedisServer

PREFIX = "genrm-bench"
#: mode → (appendonly, appendfsync)
MODES = {
    "no-aof": ("no", "everysec"),
    "everysec": ("yes", "everysec"),
    "always": ("yes", "always"),
}


def _other_db(url: str) -> str:
    parts = urlsplit(url)
    db = int(parts.path.lstrip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{db + 1}"))


async def _redis_version(url: str) -> str:
    client = aioredis.Redis.from_url(url)
    try:
        return str((await client.info("server"))["redis_version"])
    finally:
        await client.aclose()


async def _clear(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        names = [name async for name in client.scan_iter(f"{PREFIX}:*", count=1000)]
        for start in range(0, len(names), 1000):
            await client.delete(*names[start : start + 1000])
    finally:
        await client.aclose()


async def _used_memory(url: str) -> int:
    client = aioredis.Redis.from_url(url)
    try:
        return int((await client.info("memory"))["used_memory"])
    finally:
        await client.aclose()


async def _build(url: str, retained: int, active: int) -> None:
    store = RedisStore(url, prefix=PREFIX)
    await store.open(NOW)
    # bench.store journals verdicts under the bare group id; the Redis store wants the
    # cohort's group scope (as the runtime writes it), so that is what is stored here.
    records = [
        dataclasses.replace(r, scope=r.cohort.group_scope) if isinstance(r, VerdictRecord) else r
        for r in _retained(retained) + _active(active)
    ]
    for start in range(0, len(records), 5000):
        await store.persist(records[start : start + 5000])
    await store.close()


async def _recover(url: str) -> tuple[float, int, int, int]:
    store = RedisStore(url, prefix=PREFIX)
    started = time.perf_counter()
    recovered = await store.open(NOW)
    elapsed = time.perf_counter() - started
    trips = store.stats.round_trips
    await store.close()
    return elapsed, len(recovered.tombstones), len(recovered.cohorts), trips


async def _set_mode(url: str, mode: str) -> None:
    appendonly, fsync = MODES[mode]
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("appendfsync", fsync)
        await client.config_set("appendonly", appendonly)
        # Turning AOF on starts a rewrite in a child process: measure after it.
        while int((await client.info("persistence"))["aof_rewrite_in_progress"]):  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polling Redis's own flag: there is no event to wait on
    finally:
        await client.aclose()


async def _throughput(url: str, run: int, members: int, callers: int) -> dict[str, float]:
    store = RedisStore(url, prefix=PREFIX)
    await store.open(NOW)
    opened = store.stats.round_trips
    figures = await persist_one_by_one(store, member_queue(members, f"t{run}"), callers)
    trips = store.stats.round_trips - opened
    await store.close()
    return {**figures, "round_trips_per_member": trips / members}


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def run(
    url: str, retained: int, active: int, members: int, callers: int, rounds: int
) -> dict[str, object]:
    scratch = _other_db(url)
    await _clear(url)
    await _clear(scratch)
    before = await _used_memory(url)
    await _build(url, retained, active)
    used = await _used_memory(url) - before
    recoveries = [await _recover(url) for _ in range(rounds)]
    modes: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    order = list(MODES)
    for r in range(rounds):
        for mode in order if r % 2 == 0 else reversed(order):
            await _set_mode(url, mode)
            modes[mode].append(await _throughput(scratch, r, members, callers))
            await _clear(scratch)
    await _set_mode(url, "no-aof")
    await _clear(url)
    version = await _redis_version(url)
    times = [r[0] for r in recoveries]
    return {
        "redis_version": version,
        "retained": retained,
        "active": active,
        "recovery_s": _spread(times),
        "recovery_round_trips": recoveries[0][3],
        "recovered": {"tombstones": recoveries[0][1], "active": recoveries[0][2]},
        "redis_bytes_per_retained_cohort": used / max(retained, 1),
        "persist": {
            mode: {key: _spread([s[key] for s in samples]) for key in samples[0]}
            for mode, samples in modes.items()
        },
        "callers": callers,
        "members_per_round": members,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_store", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--url", help="an existing Redis (default: start one)")
    parser.add_argument("--retained", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=100)
    parser.add_argument(
        "--members", type=int, default=4096, help="member records persisted per round"
    )
    parser.add_argument("--callers", type=int, default=64, help="concurrent persist callers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    server = None if args.url else RedisServer().start()
    url = args.url or (server.url if server else "")
    try:
        figures = asyncio.run(
            run(url, args.retained, args.active, args.members, args.callers, args.rounds)
        )
    finally:
        if server is not None:
            server.close()
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
