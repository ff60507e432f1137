"""Fixtures: a real redis-server per test session, and fresh ones for outage tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.redis_support import RedisServer
from tests.store_kinds import emptied_redis_url, start_redis


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied (FLUSHALL) before the test."""
    return emptied_redis_url(redis_server)


@pytest.fixture
def redis_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start servers of the test's own (stop, pause, restart them freely)."""
    started: list[RedisServer] = []

    def make(*, appendonly: bool = False) -> RedisServer:
        server = start_redis(appendonly)
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()
