"""``serve`` refuses an address it cannot own: one line on stderr and exit code 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SERVE = [sys.executable, "-m", "genrm_grpc.cli", "serve", "--log-level", "WARNING"]


@contextmanager
def _serving(*flags: str, env: dict[str, str] | None = None) -> Iterator[int]:
    proc = subprocess.Popen(
        [*SERVE, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("genrm-grpc serving on"), line
        yield int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _refused(*flags: str, env: dict[str, str] | None = None) -> str:
    """Runs ``serve`` expecting a refusal; returns its one stderr line."""
    done = subprocess.run(
        [*SERVE, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_second_server_on_a_busy_port_is_refused_with_one_line() -> None:
    with _serving("--listen", "127.0.0.1:0") as port:
        line = _refused("--listen", f"127.0.0.1:{port}")
    assert line.startswith(f"genrm-grpc: cannot listen on 127.0.0.1:{port}: address already in use")
    assert "listen_reuse_port" in line


def test_a_port_held_by_another_program_is_refused() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        line = _refused("--listen", f"127.0.0.1:{port}")
    assert "address already in use" in line


def test_sharing_a_port_needs_listen_reuse_port_on_both_servers(tmp_path: Path) -> None:
    shared = {"GENRM_LISTEN_REUSE_PORT": "true"}
    # Two processes share the port; each has its own store file (one file, one process).
    stores = [{"GENRM_STORE": f"sqlite:///{tmp_path}/{n}.sqlite3"} for n in (1, 2)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        _serving("--listen", f"127.0.0.1:{port}", env={**shared, **stores[0]}) as first,
        _serving("--listen", f"127.0.0.1:{port}", env={**shared, **stores[1]}) as second,
    ):
        assert first == second == port


def test_an_address_not_on_this_host_is_refused_with_one_line() -> None:
    # 192.0.2.0/24 is reserved for documentation (RFC 5737): no host has it.
    line = _refused("--listen", "192.0.2.1:50051")
    assert line == "genrm-grpc: cannot listen on 192.0.2.1:50051: cannot assign requested address"


def test_a_busy_metrics_port_is_refused_with_one_line() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        line = _refused("--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}")
    assert line == (
        f"genrm-grpc: cannot listen on 127.0.0.1:{port} (metrics_listen): address already in use"
    )


def test_a_name_with_several_addresses_is_refused_when_one_of_them_is_busy() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        line = _refused("--listen", f"localhost:{port}")
    assert line.startswith(f"genrm-grpc: cannot listen on localhost:{port}: address already in use")
