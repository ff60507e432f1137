"""bench.redis_store runs end to end on a small store (figures are not checked here)."""

from __future__ import annotations

from bench.redis_store import run


async def test_the_redis_store_bench_reads_back_what_it_built(redis_url: str) -> None:
    figures = await run(redis_url, retained=20, active=2, members=128, callers=8, rounds=1)
    assert figures["recovered"] == {"tombstones": 20, "active": 2}
    persist = figures["persist"]
    assert isinstance(persist, dict) and set(persist) == {"no-aof", "everysec", "always"}
    for mode in persist.values():
        # 8 callers waiting on each other's commits: at most one round trip per member.
        assert 0 < mode["round_trips_per_member"]["median"] <= 1
