"""Redis outages against a real redis-server: stopped, killed mid-commit, paused."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from genrm_grpc.cohort.model import CohortKey, MemberCoords, Phase
from genrm_grpc.cohort.records import CohortRecord, MemberRecord, Record, WatermarkRecord
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.redis import RedisStore, RedisUnavailableError
from tests.redis_support import RedisServer
from tests.store.samples import CTX, KEY, NOW, PROMPT, digest, scope_of, verdict_record

Factory = Callable[..., RedisServer]


def cohort(key: CohortKey, members: int = 16) -> list[Record]:
    records: list[Record] = [
        CohortRecord(key, 1, members, PROMPT, "pd", Phase.COLLECTING, NOW, NOW + 60)
    ]
    records.extend(
        MemberRecord(key, MemberCoords(k), digest(k), AnswerTexts("", f"answer {k}"))
        for k in range(members)
    )
    return records


async def recovered_from(url: str) -> tuple[set[str], set[CohortKey]]:
    store = RedisStore(url)
    recovered = await store.open(NOW)
    await store.close()
    return {w.scope for w in recovered.watermarks}, {c.header.key for c in recovered.cohorts}


async def test_a_stopped_redis_fails_calls_with_its_address_and_a_restart_heals_the_store(
    redis_factory: Factory,
) -> None:
    server = redis_factory(appendonly=True)
    store = RedisStore(server.url)
    await store.open(NOW)
    await store.persist([WatermarkRecord("before", 1, NOW + 60), verdict_record(KEY, 0, 1)])

    server.stop()
    with pytest.raises(RedisUnavailableError, match=f"redis://127.0.0.1:{server.port}/0"):
        await store.persist([WatermarkRecord("during", 1, NOW + 60)])
    with pytest.raises(RedisUnavailableError, match="unreachable"):
        await store.find_verdict(scope_of(KEY), CTX, digest(0), digest(1), 0, False)
    assert store.stats.failures == 1

    server.restart()  # same port, same directory: the AOF brings back what was confirmed
    await store.persist([WatermarkRecord("after", 1, NOW + 60)])  # the same store object
    assert await store.find_verdict(scope_of(KEY), CTX, digest(0), digest(1), 0, False) == (
        verdict_record(KEY, 0, 1)
    )
    await store.close()
    scopes, _ = await recovered_from(server.url)
    assert scopes == {"before", "after"}


async def test_a_commit_cut_off_by_a_crash_writes_nothing_of_its_batch(
    redis_factory: Factory,
) -> None:
    server = redis_factory(appendonly=True)
    store = RedisStore(server.url)
    await store.open(NOW)
    kept = CohortKey("kept", None, 0)
    await store.persist(cohort(kept))
    server.pause()
    lost = CohortKey("lost", None, 0)
    cut = store.persist([*cohort(lost), WatermarkRecord("lost", 0, NOW + 60)])
    while store.stats.in_flight == 0:  # noqa: ASYNC110 - the writer sets it synchronously
        await asyncio.sleep(0)
    server.kill()  # SIGKILL while stopped: the transaction in the socket is never read
    with pytest.raises(RedisUnavailableError):
        await cut
    server.restart()
    await store.close()
    scopes, cohorts = await recovered_from(server.url)
    assert cohorts == {kept} and scopes == set()


async def test_a_redis_that_stops_answering_fails_persist_after_the_socket_timeout(
    redis_factory: Factory,
) -> None:
    server = redis_factory()
    store = RedisStore(server.url, socket_timeout_s=0.2, retries=0)
    await store.open(NOW)
    server.pause()
    with pytest.raises(RedisUnavailableError, match=server.address):
        await store.persist([WatermarkRecord("g", 1, NOW + 60)])
    server.resume()
    await store.persist([WatermarkRecord("g", 2, NOW + 60)])
    await store.close()
