"""Run a suite once per kind of store: ``sqlite`` (the default), ``memory`` and ``redis``.
The runtime is the same on each: over the in-process group store (a SQLite file, or
nothing, behind it) for the first two, over Redis for the third.

A test (or a module-scoped fixture) that asks for ``store_kind`` is parametrized over
the kinds (``DEFAULT_KINDS``, unless ``GENRM_TEST_STORES`` names others); ``GENRM_STORE``
then names that kind's store for every server the test starts, in process or as a child
process. ``@pytest.mark.stores("sqlite")`` limits a test to the kinds named, for
behaviour that belongs to one store (a SQLite file's durability, for example). The Redis
kind uses one ``redis-server`` per session, emptied (FLUSHALL) before each test or module
that uses it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from tests.redis_support import RedisBinaryMissing, RedisServer, ping

STORE_KINDS = ("sqlite", "memory", "redis")
DEFAULT_KINDS = ("sqlite", "memory")
"""The kinds a suite runs on unless ``GENRM_TEST_STORES`` (comma-separated) names others.

The suites listed in ``EVERY_KIND_BY_DEFAULT`` (server, security, fuzz, the one-process
e2e protocol tests) run on Redis too: each member decided on its group as Redis holds
it. The other store-parametrized tests start their own processes and choose their kinds
themselves.
"""


#: Suites that pass on every kind, Redis included, and so run on all three by default
#: (paths relative to the repository; ``GENRM_TEST_STORES`` still overrides).
EVERY_KIND_BY_DEFAULT = (
    "tests/server/",
    "tests/security/",
    "tests/fuzz/",
    # The e2e protocol tests that need one server process.
    "tests/e2e/test_burst.py",
    "tests/e2e/test_stream_backpressure.py",
    "tests/e2e/test_stream_isolation_process.py",
    "tests/e2e/test_principals_process.py",
)


def _defaults(metafunc: pytest.Metafunc) -> tuple[str, ...]:
    path = metafunc.definition.path.relative_to(metafunc.config.rootpath).as_posix()
    if path.startswith(EVERY_KIND_BY_DEFAULT):
        return STORE_KINDS
    return DEFAULT_KINDS


#: Read once and taken out of the environment: the server refuses unknown ``GENRM_*``
#: variables, and the servers the tests start (in process or as children) inherit it.
_CHOSEN = os.environ.pop("GENRM_TEST_STORES", "")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "stores(*kinds): run only on these kinds of store")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_kind" not in metafunc.fixturenames:
        return
    kinds = tuple(k.strip() for k in _CHOSEN.split(",") if k.strip()) or _defaults(metafunc)
    marker = metafunc.definition.get_closest_marker("stores")
    if marker:
        kinds = tuple(kind for kind in kinds if kind in marker.args)
    unknown = set(kinds) - set(STORE_KINDS)
    if unknown:
        raise pytest.UsageError(f"unknown store kinds {sorted(unknown)} for {metafunc.function}")
    metafunc.parametrize("store_kind", kinds, indirect=True, scope="module")


def start_redis(appendonly: bool = False) -> RedisServer:
    try:
        return RedisServer(appendonly=appendonly).start()
    except RedisBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session; tests that stop or pause it start their own."""
    server = start_redis()
    try:
        yield server
    finally:
        server.close()


def emptied_redis_url(server: RedisServer) -> str:
    """The server's URL, after FLUSHALL (restarted first if a test left it down)."""
    if server.proc is None or not ping(server.port):
        server.restart()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"FLUSHALL\r\n")
        assert s.recv(64).startswith(b"+OK")
    return server.url


@pytest.fixture(scope="module")
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def store_env_of_kind(
    kind: str, request: pytest.FixtureRequest, *, fresh_file: bool = False
) -> dict[str, str]:
    """The ``GENRM_*`` variables that point a server at ``kind``'s store: for the file
    kinds the per-test SQLite file, or with ``fresh_file`` (a module's server, which no
    per-test file covers) a new one."""
    env: dict[str, str] = {}
    if kind == "memory":
        env["GENRM_STORE"] = "memory://"
    elif kind == "redis":
        env["GENRM_STORE"] = emptied_redis_url(request.getfixturevalue("redis_server"))
    elif fresh_file:
        folder = request.getfixturevalue("tmp_path_factory").mktemp(f"{kind}-store")
        env["GENRM_STORE"] = f"sqlite:///{folder / 'state.sqlite3'}"
    return env


@pytest.fixture
def store_of_kind(
    store_kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Point ``GENRM_STORE`` at this test's store of ``store_kind``; returns the kind."""
    request.getfixturevalue("_sqlite_store_per_test")  # set first, so this one wins
    for name, value in store_env_of_kind(store_kind, request).items():
        monkeypatch.setenv(name, value)
    return store_kind
