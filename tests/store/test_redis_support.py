"""The test redis-server itself: found, reachable, stoppable, pausable, restartable."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.redis_support import ENV_BINARY, RedisBinaryMissing, RedisServer, find_redis_server, ping


def test_the_session_server_answers_on_a_loopback_port(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.ping() is True
        info = client.info("server")
        assert int(info["redis_version"].split(".")[0]) >= 6
        assert client.config_get("bind")["bind"] == "127.0.0.1"
    finally:
        client.close()


def test_a_stopped_server_restarts_on_the_same_port_and_keeps_its_aof(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory(appendonly=True)
    port = server.port
    client = redis.Redis(port=port)
    client.set("kept", b"1")
    client.close()
    server.kill()
    assert not ping(port)
    server.restart()
    assert server.port == port and ping(port)
    client = redis.Redis(port=port)
    try:
        assert client.get("kept") == b"1"
    finally:
        client.close()


def test_a_paused_server_answers_nothing_until_resumed(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    server.pause()
    assert not ping(server.port, timeout=0.2)
    server.resume()
    assert ping(server.port)


def test_a_missing_binary_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv(ENV_BINARY, "/nonexistent/redis-server")
    with pytest.raises(RedisBinaryMissing, match="not an executable") as caught:
        find_redis_server()
    assert "\n" not in str(caught.value)


def test_starting_and_stopping_a_server_leaves_nothing_unclosed() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        server = RedisServer()
        server.start()
        server.kill()
        server.restart()
        server.close()
        del server
        gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


def test_what_a_server_says_before_its_log_opens_is_in_the_start_up_error(
    tmp_path: Path,
) -> None:
    # A stand-in binary that fails as redis-server does on a bad config line.
    binary = tmp_path / "redis-server"
    binary.write_text("#!/bin/sh\necho '*** FATAL CONFIG FILE ERROR: Bad directive' >&2\nexit 1\n")
    binary.chmod(0o755)
    server = RedisServer(binary=str(binary))
    with pytest.raises(RuntimeError, match="FATAL CONFIG FILE ERROR"):
        server.start()
    server.close()
