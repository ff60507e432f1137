"""Group leases with fencing tokens against a real redis-server: a holder whose lease
ran out — expired while it kept its token, or paused with SIGSTOP — never writes again."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from genrm_grpc.store.lease import GroupLeases, Lease
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.redis import RedisStore, RedisUnavailableError
from tests.redis_support import free_port

SCOPE = "5:alicejob-42/prompt-7"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


def leases(client: aioredis.Redis, replica: str) -> GroupLeases:
    return GroupLeases(client, replica=replica, address="redis://test")


async def wait_until_expired(group: GroupLeases, scope: str) -> None:
    """Poll (bounded) until Redis expired the lease: the order comes from Redis, not a sleep."""
    deadline = time.monotonic() + 10
    while await group.holder(scope) is not None:
        assert time.monotonic() < deadline, "the lease did not expire"
        await asyncio.sleep(0.01)


async def test_one_holder_at_a_time_and_tokens_only_grow(client: aioredis.Redis) -> None:
    a, b = leases(client, "replica-a"), leases(client, "replica-b")
    first = await a.acquire(SCOPE, 10)
    assert first is not None
    assert await b.acquire(SCOPE, 10) is None
    assert await a.acquire(SCOPE, 10) is None  # a second acquisition is another holder
    assert await a.release(first)
    second = await b.acquire(SCOPE, 10)
    assert second is not None and second.token > first.token
    assert await b.holder(SCOPE) == (second.token, second.owner)
    other = await a.acquire("5:alicejob-42/prompt-8", 10)
    assert other is not None  # another group, another lease


async def test_a_holder_whose_lease_expired_can_never_write_renew_or_release(
    client: aioredis.Redis,
) -> None:
    a, b = leases(client, "replica-a"), leases(client, "replica-b")
    stale = await a.acquire(SCOPE, 0.05)
    assert stale is not None
    assert await a.fenced_write(stale, [("SET", "genrm:state", "from-a")])
    await wait_until_expired(a, SCOPE)  # a keeps its token, as a paused replica would

    current = await b.acquire(SCOPE, 10)
    assert current is not None and current.token > stale.token
    assert not await a.fenced_write(stale, [("SET", "genrm:state", "stale")])
    assert await a.renew(stale, 10) is None
    assert not await a.release(stale)
    assert await client.get("genrm:state") == b"from-a"
    assert await b.holder(SCOPE) == (current.token, current.owner)
    assert await b.fenced_write(current, [("SET", "genrm:state", "from-b")])
    assert await client.get("genrm:state") == b"from-b"


async def test_a_fenced_write_is_all_or_nothing(client: aioredis.Redis) -> None:
    group = leases(client, "replica-a")
    lease = await group.acquire(SCOPE, 10)
    assert lease is not None
    ops = [
        ("HSET", "genrm:h", "phase", "evaluating"),
        ("RPUSH", "genrm:events", "published"),
        ("PEXPIREAT", "genrm:h", int((time.time() + 60) * 1000)),
    ]
    assert await group.fenced_write(lease, ops)
    assert await client.hget("genrm:h", "phase") == b"evaluating"
    assert await client.lrange("genrm:events", 0, -1) == [b"published"]
    assert await client.pttl("genrm:h") > 50_000
    released = Lease(lease.scope, lease.owner, lease.token, lease.valid_until)
    assert await group.release(released)
    assert not await group.fenced_write(lease, [("DEL", "genrm:h"), ("DEL", "genrm:events")])
    assert await client.exists("genrm:h", "genrm:events") == 2
    with pytest.raises(ValueError, match="FLUSHALL"):
        await group.fenced_write(lease, [("FLUSHALL", "x")])


async def test_renewing_extends_the_lease_in_redis(client: aioredis.Redis) -> None:
    group = leases(client, "replica-a")
    lease = await group.acquire(SCOPE, 0.5)
    assert lease is not None
    renewed = await group.renew(lease, 30)
    assert renewed is not None and renewed.token == lease.token
    assert renewed.valid_until > lease.valid_until
    assert await client.pttl(group.lease_key(SCOPE)) > 20_000


async def test_the_lease_lives_in_the_groups_hash_slot(redis_url: str) -> None:
    store = RedisStore(redis_url)
    group = store.leases(replica="replica-a")
    assert group.address == store.address
    tag = group.lease_key(SCOPE).split("{", 1)[1]
    assert group.fence_key(SCOPE).endswith("{" + tag)
    assert store._keys.watermark(SCOPE).endswith("{" + tag)
    await store.close()


async def test_lease_calls_against_an_unreachable_redis_name_the_address() -> None:
    port = free_port()
    store = RedisStore(f"redis://127.0.0.1:{port}/0", retries=0)
    group = store.leases(replica="replica-a")
    with pytest.raises(RedisUnavailableError, match=f"127.0.0.1:{port}"):
        await group.acquire(SCOPE, 10)
    assert isinstance(RedisUnavailableError("x"), StoreError)
    await store.close()


_PAUSED_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import redis.asyncio as aioredis
    from genrm_grpc.store.lease import GroupLeases

    async def main():
        client = aioredis.Redis.from_url(sys.argv[1])
        group = GroupLeases(client, replica="paused", address="redis://test")
        lease = await group.acquire(sys.argv[2], 0.2)
        print(lease.token, flush=True)
        sys.stdin.readline()  # SIGSTOPped here, woken after another replica took over
        print(await group.fenced_write(lease, [("SET", "genrm:state", "paused")]), flush=True)
        await client.aclose()

    asyncio.run(main())
    """
)


async def test_a_replica_paused_past_its_lease_cannot_write_when_it_wakes(
    redis_url: str, client: aioredis.Redis
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PAUSED_HOLDER,
        redis_url,
        SCOPE,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ},
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        paused_token = int(await proc.stdout.readline())
        proc.send_signal(signal.SIGSTOP)
        other = leases(client, "replica-b")
        await wait_until_expired(other, SCOPE)
        current = await other.acquire(SCOPE, 10)
        assert current is not None and current.token > paused_token
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write(b"wake\n")
        await proc.stdin.drain()
        assert (await proc.stdout.readline()).strip() == b"False"
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert await client.get("genrm:state") is None
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            await proc.wait()
