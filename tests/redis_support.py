"""The tests' redis-server: see ``genrm_grpc.testing.redis_server`` (the bench uses it too)."""

from genrm_grpc.testing.redis_server import (
    ENV_BINARY,
    RedisBinaryMissing,
    RedisServer,
    find_redis_server,
    free_port,
    ping,
)

__all__ = [
    "ENV_BINARY",
    "RedisBinaryMissing",
    "RedisServer",
    "find_redis_server",
    "free_port",
    "ping",
]
