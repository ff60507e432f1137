"""Fixtures: a real redis-server per test session, and fresh ones for outage tests."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.redis_support import RedisBinaryMissing, RedisServer, ping


def _start(appendonly: bool = False) -> RedisServer:
    try:
        return RedisServer(appendonly=appendonly).start()
    except RedisBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session; tests that stop or pause it use redis_factory."""
    server = _start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied (FLUSHALL) before the test."""
    if redis_server.proc is None or not ping(redis_server.port):
        redis_server.restart()
    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=5) as s:
        s.sendall(b"FLUSHALL\r\n")
        assert s.recv(64).startswith(b"+OK")
    return redis_server.url


@pytest.fixture
def redis_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start servers of the test's own (stop, pause, restart them freely)."""
    started: list[RedisServer] = []

    def make(*, appendonly: bool = False) -> RedisServer:
        server = _start(appendonly)
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()
