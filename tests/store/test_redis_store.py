"""The Redis store's own behaviour against a real redis-server: group commit, round
trips, TTLs, the key layout, bad batches, start-up and outages."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable

import pytest
import redis

from genrm_grpc.cohort.model import CohortKey, Failed, MemberCoords, Phase
from genrm_grpc.cohort.records import (
    CohortRecord,
    MemberRecord,
    Record,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.durable import store_from_url, validate_store_url
from genrm_grpc.store.records import StoreError, StoreSchemaError
from genrm_grpc.store.redis import RedisStartupError, RedisStore
from tests.redis_support import RedisServer, free_port
from tests.store.samples import KEY, NOW, PROMPT, digest, tombstone, verdict_record


def cohort_records(key: CohortKey, members: int = 16) -> list[Record]:
    records: list[Record] = [
        CohortRecord(key, 1, members, PROMPT, "pd", Phase.COLLECTING, NOW, NOW + 1800)
    ]
    records.extend(
        MemberRecord(key, MemberCoords(k), digest(k), AnswerTexts("r", f"answer {k}"))
        for k in range(members)
    )
    return records


async def test_batches_queued_during_a_round_trip_share_the_next_one(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    store = RedisStore(server.url)
    await store.open(NOW)
    server.pause()  # the first commit's round trip cannot finish until resume()
    first = store.persist([WatermarkRecord("g0", 0, NOW + 10)])
    while store.stats.in_flight == 0:  # noqa: ASYNC110 - the writer sets it synchronously
        await asyncio.sleep(0)
    rest = [store.persist([WatermarkRecord(f"g{n}", n, NOW + 10)]) for n in range(1, 200)]
    server.resume()
    await asyncio.gather(first, *rest)
    assert store.stats.batches == 200
    assert store.stats.commits == 2
    await store.close()


async def test_a_cohort_of_sixteen_members_is_one_round_trip(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    before = store.stats.round_trips
    await store.persist(cohort_records(KEY))
    assert store.stats.round_trips - before == 1
    assert store.stats.records == 17
    await store.close()


async def test_every_key_of_a_group_shares_one_hash_tag(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    scope = KEY.group_scope
    assert scope is not None
    await store.persist(
        [
            *cohort_records(KEY, 2),
            verdict_record(KEY, 0, 1),
            TombstoneRecord(tombstone(KEY, Failed("x")), NOW + 60),
            WatermarkRecord(scope, 1, NOW + 60),
        ]
    )
    await store.close()
    client = redis.Redis.from_url(redis_url)
    try:
        names = [n.decode() for n in client.scan_iter("genrm:*")]
    finally:
        client.close()
    kinds = {n.split(":")[1] for n in names}
    # it, iw: the deployment-wide retention indexes (genrm:it, genrm:iw), no group's.
    assert kinds == {"c", "v", "r", "t", "w", "it", "iw"}
    grouped = [n for n in names if n not in ("genrm:it", "genrm:iw")]
    tags = {re.search(r"\{([0-9a-f]{20})\}", n).group(1) for n in grouped}  # type: ignore[union-attr]
    assert len(tags) == 1


async def test_expiring_records_carry_a_redis_ttl_at_their_expiry(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    wall = time.time()  # Redis expires keys by its own (this machine's) clock
    await store.persist(
        [
            TombstoneRecord(tombstone(KEY, Failed("x")), wall + 600),
            WatermarkRecord("g", 3, wall + 900),
            TombstoneRecord(tombstone(CohortKey("gone", None, 0), Failed("x")), wall - 1),
        ]
    )
    await store.close()
    client = redis.Redis.from_url(redis_url)
    try:
        ttls = {n.decode().split(":")[1]: client.pttl(n) for n in client.scan_iter("genrm:*")}
    finally:
        client.close()
    # The tombstone already past its expiry is gone (from its index too); the others
    # expire when they should. The indexes have no TTL: they forget entries as they expire.
    assert set(ttls) == {"t", "w", "it", "iw"}
    assert ttls["it"] == ttls["iw"] == -1
    assert 590_000 < ttls["t"] <= 600_000
    assert 890_000 < ttls["w"] <= 900_000


async def test_a_batch_that_cannot_be_encoded_fails_alone(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    good = store.persist([WatermarkRecord("good", 1, NOW + 10)])
    bad = store.persist(["not a record"])  # type: ignore[list-item]
    also_good = store.persist([WatermarkRecord("also", 1, NOW + 10)])
    await good
    await also_good
    with pytest.raises(StoreError, match="cannot write"):
        await bad
    await store.close()


async def test_a_batch_that_fails_inside_the_transaction_fails_alone(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    client = redis.Redis.from_url(redis_url)
    try:
        # Something else wrote the watermark key as a hash: the script fails in EXEC.
        client.hset(store._keys.watermark("broken"), "x", "1")
    finally:
        client.close()
    good = store.persist([WatermarkRecord("good", 1, NOW + 10)])
    bad = store.persist([WatermarkRecord("broken", 1, NOW + 10)])
    await good
    with pytest.raises(StoreError, match="could not commit"):
        await bad
    assert not isinstance(store.stats.last_error, type(None))
    await store.close()
    again = RedisStore(redis_url)
    with pytest.raises(RedisStartupError):
        await again.open(NOW)  # a foreign value under our keys: refuse, do not guess
    await again.close()


async def test_opening_an_unreachable_redis_is_one_line_naming_the_address() -> None:
    port = free_port()
    store = RedisStore(f"redis://:secret@127.0.0.1:{port}/3")
    with pytest.raises(RedisStartupError) as caught:
        await store.open(NOW)
    message = str(caught.value)
    assert isinstance(caught.value, StoreSchemaError)
    assert f"redis://127.0.0.1:{port}/3" in message
    assert "\n" not in message and "secret" not in message
    await store.close()


def test_redis_store_urls() -> None:
    store = store_from_url("redis://127.0.0.1:6390/2")
    assert isinstance(store, RedisStore) and store.address == "redis://127.0.0.1:6390/2"
    assert validate_store_url("redis://redis.internal") == "redis://redis.internal"
    for bad in ("redis://", "redis://h:port/0", "redis://h:6379/x", "redis://h/0?db=1"):
        with pytest.raises(ValueError):
            validate_store_url(bad)
