"""The fake judge as a subprocess, controlled over its HTTP API (/faults, /stats).

A subprocess keeps the judge's threads, hung requests and per-pair counters out of the
process whose RSS the soak measures, and gives the judge its own core.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from types import TracebackType
from typing import Any, Self

import httpx


class JudgeProcess:
    """``python -m genrm_grpc.testing.cli`` on a free loopback port."""

    def __init__(self, *, seed: int = 0, retry_after_s: float = 0.0) -> None:
        self._seed = seed
        self._retry_after_s = retry_after_s
        self._proc: asyncio.subprocess.Process | None = None
        self._http: httpx.AsyncClient | None = None
        self.url = ""
        self.port = 0
        self.restarts = 0

    async def __aenter__(self) -> Self:
        await self._spawn(0)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=30)
        return self

    async def _spawn(self, port: int) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "genrm_grpc.testing.cli",
            "--port",
            str(port),
            "--seed",
            str(self._seed),
            "--retry-after-s",
            str(self._retry_after_s),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert self._proc.stdout is not None
        async with asyncio.timeout(30):
            line = (await self._proc.stdout.readline()).decode()
        if "listening on " not in line:
            raise RuntimeError(f"fake judge did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1].strip("/"))

    async def restart(self, down_s: float) -> None:
        """Kill the judge (SIGKILL: a crash, its connections reset), stay down for
        ``down_s``, start a fresh one on the same port (fault-free, counters at zero)."""
        proc = self._proc
        assert proc is not None, "judge not started"
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        await asyncio.sleep(down_s)  # the outage itself, not a synchronisation
        url = self.url
        await self._spawn(self.port)
        if self.url != url:
            raise RuntimeError(f"restarted judge listens on {self.url}, not {url}")
        self.restarts += 1

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            await self._http.aclose()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    @property
    def _client(self) -> httpx.AsyncClient:
        assert self._http is not None, "judge not started"
        return self._http

    async def set_faults(self, faults: dict[str, Any]) -> None:
        response = await self._client.post("/faults", json=faults)
        response.raise_for_status()

    async def stats(self) -> dict[str, Any]:
        response = await self._client.get("/stats")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    async def reset_stats(self) -> None:
        response = await self._client.post("/stats/reset")
        response.raise_for_status()
