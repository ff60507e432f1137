"""Retention on the Redis store: max_terminal_cohorts bounds the tombstones of the whole
deployment, and the indexes that bound them count what is held (the replicas' gauges)."""

from __future__ import annotations

import time

import redis

from genrm_grpc.cohort.model import CohortKey, Failed
from genrm_grpc.cohort.records import (
    DropTombstone,
    DropWatermark,
    Record,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.store.redis import RedisStore
from genrm_grpc.store.shared import SharedGroups
from tests.store.samples import NOW, tombstone, verdict_record

# A group scope per cohort, so that each has its own hash tag, journal and reuse index.
KEYS = [CohortKey(f"group-{n}", None, 0) for n in range(5)]


def _ended(key: CohortKey, expires_at: float) -> list[Record]:
    return [verdict_record(key, 0, 1), TombstoneRecord(tombstone(key, Failed("x")), expires_at)]


def _names(url: str, pattern: str) -> set[str]:
    client = redis.Redis.from_url(url)
    try:
        return {n.decode() for n in client.scan_iter(pattern)}
    finally:
        client.close()


async def test_past_max_terminal_cohorts_the_tombstones_expiring_first_go_with_their_verdicts(
    redis_url: str,
) -> None:
    store = RedisStore(redis_url, max_tombstones=3)
    await store.open(NOW)
    for n, key in enumerate(KEYS):  # each one expires later than the one before
        await store.persist(_ended(key, NOW + 600 + n))
    recovered = await store.open(NOW)
    await store.close()
    assert [t.tombstone.key for t in recovered.tombstones] == KEYS[2:]
    # The dropped cohorts' journals and reuse entries went with them; the kept ones stay.
    assert len(_names(redis_url, "genrm:t:*")) == 3
    assert len(_names(redis_url, "genrm:v:*")) == 3
    client = redis.Redis.from_url(redis_url)
    try:
        questions = [
            [f for f in client.hkeys(store._keys.reuse(key)) if f != b"~exp"] for key in KEYS
        ]
        assert client.zcard("genrm:it") == 3
    finally:
        client.close()
    assert [len(q) for q in questions] == [0, 0, 1, 1, 1]


async def test_without_a_bound_only_the_ttl_limits_what_is_retained(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    for n, key in enumerate(KEYS):
        await store.persist(_ended(key, NOW + 600 + n))
    recovered = await store.open(NOW)
    await store.close()
    assert len(recovered.tombstones) == 5


async def test_the_census_counts_what_the_store_retains_and_forgets_the_dropped(
    redis_url: str,
) -> None:
    store = RedisStore(redis_url, max_tombstones=10)
    await store.open(NOW)
    shared = SharedGroups(store, lease_s=10)
    wall = time.time()
    await store.persist(
        [
            *_ended(KEYS[0], wall + 600),
            *_ended(KEYS[1], wall + 600),
            WatermarkRecord("group-0", 0, wall + 600),
            WatermarkRecord("group-1", 0, wall + 600),
            WatermarkRecord("group-2", 0, wall + 600),
        ]
    )
    assert await shared.census(wall) == (0, 0, 2, 3)
    await store.persist([DropTombstone(KEYS[0]), DropWatermark("group-2")])
    assert await shared.census(wall) == (0, 0, 1, 2)
    # Past their expiry they are no longer counted (Redis dropped the keys themselves).
    assert await shared.census(wall + 601) == (0, 0, 0, 0)
    await store.close()
