"""Real processes for judge tests: the fake judge CLI on a fixed port, the server CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PY = (sys.executable, "-m", "genrm_grpc.cli")


def _close_pipes(proc: subprocess.Popen[str]) -> None:
    """A process that ended: close the pipes this side kept (its readiness line's)."""
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FakeJudgeProcess:
    """``genrm-grpc fake-judge`` on one port; can be stopped and started again on it."""

    def __init__(self, port: int | None = None, *args: str, host: str = "127.0.0.1") -> None:
        self.port = port if port is not None else free_port()
        self.host = host
        self.args = args
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeJudgeProcess:
        assert self.proc is None
        proc = subprocess.Popen(
            [*PY, "fake-judge", "--host", self.host, "--port", str(self.port), *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            proc.kill()
            proc.wait(timeout=30)
            _close_pipes(proc)
            raise RuntimeError(f"fake judge did not start: {line!r}")
        self.proc = proc
        return self

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _close_pipes(self.proc)
        self.proc = None

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/stats", timeout=10) as reply:
            result: dict[str, Any] = json.loads(reply.read())
            return result

    def set_faults(self, **faults: Any) -> None:
        request = urllib.request.Request(
            self.url + "/faults",
            data=json.dumps(faults).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()

    def kill(self) -> None:
        """SIGKILL: connections drop mid-request, nothing is flushed."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)
        _close_pipes(self.proc)
        self.proc = None

    def control(self, **changes: Any) -> dict[str, Any]:
        """``POST /control`` of a farm node (mode, models, health, ...)."""
        request = urllib.request.Request(
            self.url + "/control",
            data=json.dumps(changes).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            state: dict[str, Any] = json.loads(reply.read())
            return state

    def wait_for(self, timeout: float = 60, **targets: int) -> dict[str, Any]:
        """``GET /wait``: the node's stats once every named counter reached its value."""
        query = "&".join(f"{k}={v}" for k, v in targets.items())
        url = f"{self.url}/wait?{query}&timeout={timeout}"
        try:
            with urllib.request.urlopen(url, timeout=timeout + 10) as reply:
                node: dict[str, Any] = json.loads(reply.read())
                return node
        except urllib.error.HTTPError as exc:
            raise AssertionError(
                f"node {self.url} never reached {targets}: {exc.read()!r}"
            ) from None

    def __enter__(self) -> FakeJudgeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess:
    """``genrm-grpc serve`` with settings from the environment; stderr lines collected."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}
        self.lines: list[str] = []
        self.target = ""
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> ServerProcess:
        proc = subprocess.Popen(
            [*PY, "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._reader.start()
        line = proc.stdout.readline()
        if not line.startswith("genrm-grpc serving on"):
            proc.kill()
            self.stop()  # its stderr read to the end, its pipes closed
            raise RuntimeError(f"server did not start: {line!r} {self.log_lines()}")
        self.target = line.rsplit(" ", 1)[1].strip()
        return self

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def log_lines(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        _close_pipes(self._proc)
        self._proc = None

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RestartableServer:
    """``genrm-grpc serve`` on a fixed port over one store URL: SIGKILL it, start again.

    Its stderr (JSON log lines) is appended to ``log`` across restarts, never a pipe
    that a chatty server could fill. ``GENRM_METRICS_LISTEN`` is set to a port of its
    own so that :meth:`metric` can read the Prometheus endpoint.
    """

    def __init__(self, store: str, judge_url: str | list[str], log: Path, **settings: str) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log = log
        self.env = {
            **os.environ,
            "GENRM_STORE": store,
            **(
                {"GENRM_JUDGE__URL": judge_url}
                if isinstance(judge_url, str)
                else {"GENRM_JUDGE__URLS": json.dumps(judge_url)}
            ),
            "GENRM_JUDGE_MAX_CONCURRENCY": "2",
            "GENRM_GENRM_PARSE_RETRIES": "0",
            "GENRM_METRICS_LISTEN": f"127.0.0.1:{free_port()}",
            **settings,
        }
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0

    def start(self) -> RestartableServer:
        assert self.proc is None
        with self.log.open("a") as log:
            proc = subprocess.Popen(
                [*PY, "serve", "--listen", self.target],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=self.env,
            )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("genrm-grpc serving on"):
            proc.kill()
            proc.wait(timeout=30)
            _close_pipes(proc)
            raise RuntimeError(f"server did not start: {line!r} {self.log.read_text()[-3000:]}")
        self.proc = proc
        self.starts += 1
        return self

    def kill(self) -> None:
        """SIGKILL: no drain, no flush."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        _close_pipes(self.proc)
        self.proc = None

    def stop(self) -> int:
        """SIGTERM and wait for the drain; the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        _close_pipes(self.proc)
        self.proc = None
        return code

    def close(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
            _close_pipes(self.proc)
            self.proc = None

    def metric(self, name: str) -> float:
        """The sum of a metric's samples on this server's Prometheus endpoint."""
        url = "http://" + self.env["GENRM_METRICS_LISTEN"] + "/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{")
        )
