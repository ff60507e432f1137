"""Batches fenced by an evaluation lease, against a real redis-server: written while the
lease is current, refused whole once another replica took the cohort over."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from genrm_grpc.cohort.model import CohortKey, MemberCoords, Phase
from genrm_grpc.cohort.records import CohortRecord, MemberRecord, Record, WatermarkRecord
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.redis import LeaseLostError, RedisStore
from genrm_grpc.store.shared import VERSION_TTL_S, SharedGroups
from tests.store.samples import NOW, PROMPT, digest, scope_of, verdict_record

KEY = CohortKey("job-42/prompt-7", None, 0, "alice")


def decision(key: CohortKey, slot: int) -> list[Record]:
    """What one accepted member writes: the header, the member, the watermark."""
    return [
        CohortRecord(key, 1, 4, PROMPT, "pd", Phase.COLLECTING, NOW, NOW + 60),
        MemberRecord(key, MemberCoords(slot), digest(slot), AnswerTexts("", f"a{slot}")),
        WatermarkRecord(scope_of(key), key.attempt, NOW + 60),
    ]


async def test_a_stale_lease_holders_batch_is_refused_whole_and_a_neighbour_still_lands(
    redis_url: str,
) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    mine = SharedGroups(store, lease_s=0.05, replica="replica-a")
    lease = await mine.claim(KEY)
    assert lease is not None
    await store.persist(decision(KEY, 0), lease=lease)

    client = aioredis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 10
        while await client.exists(lease.key):  # Redis expires the lease, we only look
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()
    theirs = await SharedGroups(store, lease_s=10, replica="replica-b").claim(KEY)
    assert theirs is not None and theirs.token > lease.token

    other = CohortKey("job-42/prompt-8", None, 0, "alice")
    stale = store.persist([*decision(KEY, 1), verdict_record(KEY, 0, 1)], lease=lease)
    neighbour = store.persist(decision(other, 0))  # the same commit
    with pytest.raises(LeaseLostError, match="nothing written"):
        await stale
    assert store.write_failures == 0  # the fence refused it: the store did not fail
    await neighbour
    await store.persist(decision(KEY, 2), lease=theirs)
    await store.close()

    again = RedisStore(redis_url)
    recovered = await again.open(NOW)
    await again.close()
    members = {c.header.key: [m.coords.rollout_index for m in c.members] for c in recovered.cohorts}
    assert members == {KEY: [0, 2], other: [0]}
    assert recovered.verdicts == ()


async def test_a_fenced_batch_may_write_only_its_own_group(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    lease = await SharedGroups(store, lease_s=10).claim(KEY)
    assert lease is not None
    stranger = CohortKey("job-42/prompt-9", None, 0, "alice")
    with pytest.raises(StoreError, match="fenced by the lease of one group"):
        await store.persist(decision(KEY, 0) + decision(stranger, 0), lease=lease)
    await store.close()


async def test_commits_survive_redis_forgetting_its_scripts(redis_url: str) -> None:
    store = RedisStore(redis_url)
    await store.open(NOW)
    await store.persist([WatermarkRecord("g", 1, NOW + 60)])
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.script_flush()  # as after a Redis restart
    finally:
        await client.aclose()
    await store.persist([WatermarkRecord("g", 2, NOW + 60)])
    await store.close()
    again = RedisStore(redis_url)
    recovered = await again.open(NOW)
    await again.close()
    assert recovered.watermarks == (WatermarkRecord("g", 2, NOW + 60),)


async def test_a_claimed_fence_counter_lives_as_long_as_a_committed_one(redis_url: str) -> None:
    """The fence counter must outlive every lease it numbers: a claim gives it the same
    lifetime as a commit that takes the lease does (VERSION_TTL_S), not its own."""
    store = RedisStore(redis_url)
    await store.open(NOW)
    shared = SharedGroups(store, lease_s=10, replica="replica-a")
    key = CohortKey("job-42/prompt-9", None, 0, "alice")
    assert await shared.claim(key) is not None
    client = aioredis.Redis.from_url(redis_url)
    try:
        lifetime_ms = await client.pttl(shared._keys.fence(key))
    finally:
        await client.aclose()
    await store.close()
    assert VERSION_TTL_S * 1000 - 60_000 < lifetime_ms <= VERSION_TTL_S * 1000
