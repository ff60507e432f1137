"""The one process launcher of the benchmarks: every section starts its server, judges,
baselines and load generator through it, each as
a process of its own reached over loopback.

A launched process prints one readiness line with its address (``serving on HOST:PORT``,
``listening on ...``); :class:`Proc` waits for it, keeps stderr in ``LOGS/NAME.log``,
reads the process's CPU time from ``/proc/PID/stat`` and stops it with SIGTERM (SIGKILL
after 15 s). Nothing here reaches into a server's internals: a ``genrm-grpc serve`` is
configured by its YAML file and ``GENRM_STORE`` only.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import IO, Any

PRINCIPLE = (
    "Judge which response better answers the user: correct, complete and clear; "
    "prefer the shorter one when they are equally good."
)
MODEL = "bench-genrm"
_CLK = os.sysconf("SC_CLK_TCK")
#: The repository root (the launched modules are imported from this checkout).
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _user_system(stat: pathlib.Path) -> tuple[float, float]:
    """User and system CPU seconds from a ``/proc/…/stat`` file (fields 14 and 15; the
    command name before them may hold spaces and parentheses)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _CLK, int(fields[12]) / _CLK


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads (Linux /proc/PID/stat)."""
    return sum(_user_system(pathlib.Path(f"/proc/{pid}/stat")))


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """Each thread of a process by its id: its kernel name (``comm``) and its user and
    system CPU seconds (``/proc/PID/task/TID/stat``). A thread that ends while it is
    read is left out."""
    threads: dict[int, tuple[str, float, float]] = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            threads[int(task.name)] = (comm, *_user_system(task / "stat"))
        except OSError:
            continue
    return threads


class Proc:
    """A child process that prints one readiness line with its address."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        ready: str,
        logs: pathlib.Path,
        *,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        cwd: pathlib.Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        self._log = self.log_path.open("w")
        self.started = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd=cwd,
        )
        assert self.proc.stdout is not None
        self.stdout: IO[str] = self.proc.stdout
        self.port = 0
        self.ready_s = math.nan
        pattern = re.compile(ready)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.stdout.readline()
            if not line:
                break
            found = pattern.search(line)
            if found:
                self.port = int(found.group(1)) if found.groups() else 0
                self.ready_s = time.perf_counter() - self.started
                return
        self.stop()
        raise RuntimeError(f"{name} did not start; see {self.log_path}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def threads(self) -> dict[int, tuple[str, float, float]]:
        return thread_cpu(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Judge(Proc):
    def __init__(self, name: str, latency_ms: float, logs: pathlib.Path) -> None:
        argv = [sys.executable, "-m", "bench.judge", "--latency-ms", str(latency_ms)]
        super().__init__(name, argv, r"listening on [\d.]+:(\d+)", logs)
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, path: str, method: str = "GET") -> Any:
        req = urllib.request.Request(
            self.url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._call("/stats")
        return stats

    def reset(self) -> None:
        self._call("/stats/reset", "POST")

    def record(self, n: int) -> None:
        self._call(f"/record?n={n}", "POST")

    def bodies(self) -> list[Any]:
        bodies: list[Any] = self._call("/bodies")
        return bodies


def _genrm_grpc() -> list[str]:
    exe = shutil.which("genrm-grpc", path=str(pathlib.Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "genrm_grpc.cli"]


def fresh_store(logs: pathlib.Path, name: str) -> str:
    """``sqlite:////ABS/PATH`` of a new store file for one server (old copies removed)."""
    path = (logs / f"{name}.sqlite3").resolve()
    for old in path.parent.glob(f"{path.name}*"):
        old.unlink()
    return f"sqlite:///{path}"


def start_service(
    name: str,
    judge: Judge | FakeJudge | str,
    logs: pathlib.Path,
    *,
    concurrency: int,
    store: str | None = None,
    judge_keys: dict[str, Any] | None = None,
    **extra: Any,
) -> Proc:
    """``genrm-grpc serve`` with its store set through ``GENRM_STORE``, never the default
    file in the working directory: ``memory://`` by default, so that sections 1–5 measure
    the service's own work (the store's cost is the ``store`` section's subject); a
    SQLite side passes ``store=fresh_store(...)``, a new file of its own (the store
    refuses a second process on one file). ``judge_keys`` go into the ``judge:`` block
    (a farm's ``urls`` replace ``url``)."""
    url = judge if isinstance(judge, str) else judge.url
    config = {
        "listen": "127.0.0.1:0",
        "judge": {
            "url": url,
            "api": "responses",
            "model": MODEL,
            "max_connections": max(64, concurrency),
            **(judge_keys or {}),
        },
        "default_principle": PRINCIPLE,
        "comparison_strategy": "circular",
        "judge_max_concurrency": concurrency,
        "max_concurrent_streams": 4096,
        "log_level": "WARNING",
        **extra,
    }
    if "urls" in config["judge"]:
        del config["judge"]["url"]  # one spelling or the other
    path = logs / f"{name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    argv = _genrm_grpc()
    env = {"GENRM_STORE": store or "memory://"}
    return Proc(
        name, [*argv, "serve", "--config", str(path)], r"serving on [\d.]+:(\d+)", logs, env=env
    )


def start_replicas(
    prefix: str, count: int, judge: Judge | str, logs: pathlib.Path, **kw: Any
) -> list[Proc]:
    """``count`` servers of one configuration (``PREFIX-0`` …), e.g. replicas on one
    ``redis://`` store; all are stopped if one fails to start."""
    procs: list[Proc] = []
    try:
        for k in range(count):
            procs.append(start_service(f"{prefix}-{k}", judge, logs, **kw))
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def start_baseline(
    name: str, mode: str, judge: Judge, logs: pathlib.Path, *, concurrency: int
) -> Proc:
    argv = [
        sys.executable,
        "-m",
        "bench.baseline",
        "--mode",
        mode,
        "--judge-url",
        judge.url,
        "--model",
        MODEL,
        "--principle",
        PRINCIPLE,
        "--concurrency",
        str(concurrency),
    ]
    return Proc(name, argv, r"serving on [\d.]+:(\d+)", logs)


class LoadGen(Proc):
    def __init__(self, logs: pathlib.Path) -> None:
        argv = [sys.executable, "-m", "bench.loadgen"]
        super().__init__("loadgen", argv, r"\"ready\"", logs, stdin=True)

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        line = self.stdout.readline()
        if not line:
            raise RuntimeError(f"loadgen exited; see {self.log_path}")
        out: dict[str, Any] = json.loads(line)
        if "exception" in out:
            raise RuntimeError(f"loadgen failed: {out['exception']}")
        return out

    def run(self, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return self.result()


class FakeJudge(Proc):
    """``genrm-grpc fake-judge``: the OpenAI-API test double with per-pair counts
    (``/stats``) and faults switched at run time (``/faults``); see docs/fake-judge.md."""

    def __init__(self, name: str, logs: pathlib.Path, *flags: str) -> None:
        argv = [*_genrm_grpc(), "fake-judge", "--port", "0", "--model", MODEL, *flags]
        super().__init__(name, argv, r"listening on http://[\d.]+:(\d+)", logs)
        self.url = f"http://127.0.0.1:{self.port}"

    def call(self, path: str, body: Any = None, timeout: float = 120) -> Any:
        """GET ``path`` (no body) or POST ``body`` as JSON; the decoded answer."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"content-type": "application/json"},
            method="GET" if body is None else "POST",
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.call("/stats")
        return stats

    def reset(self) -> None:
        self.call("/stats/reset", {})

    def faults(self, **changes: Any) -> None:
        self.call("/faults", changes)


#: Directory of the NeMo Gym resources server package ``genrm_grpc_compare``.
GYM_INTEGRATION = ROOT / "integrations" / "nemo_gym"


def gym_env() -> dict[str, str]:
    """``PYTHONPATH`` for a process under the Gym venv: this checkout, its Python client
    and the ``genrm_grpc_compare`` package."""
    paths = [str(ROOT), str(ROOT / "clients" / "python"), str(GYM_INTEGRATION)]
    old = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])])}


def start_gym(name: str, kind: str, logs: pathlib.Path, *args: str) -> Proc:
    """One of :mod:`bench.gym_servers` (``model``, ``genrm_compare``,
    ``genrm_grpc_compare``) under this interpreter, which must be the Gym venv's."""
    argv = [sys.executable, "-m", "bench.gym_servers", kind, *args]
    # cwd: Gym's servers write Hydra's outputs/ into their working directory.
    return Proc(name, argv, r"serving on [\d.]+:(\d+)", logs, env=gym_env(), cwd=logs)
