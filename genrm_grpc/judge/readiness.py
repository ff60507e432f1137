"""The judge is part of readiness: probe it, and take the cohort service out of rotation
while it has been unreachable for longer than a window.

:class:`JudgeReadiness` is a small clock-driven state (unreachable since when); the
judge client feeds it from real traffic (an HTTP answer → reachable; a connection
failure, reset, timeout or 502/503/504 → unreachable) and :class:`JudgeMonitor` from
probes. The monitor probes once at start-up (``judge_probe: startup``), logs one line
about the judge, and while the judge is unreachable probes it again every
``window / 4`` (at most every 5 s) so that recovery is noticed without traffic, which a
load balancer stops sending to a NOT_SERVING pod. It calls ``on_change(ready)`` only when
readiness changes; the server maps that to the health status of the cohort service
(overall health stays SERVING so that liveness probes do not restart the pod).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from genrm_grpc.judge.client import JudgeClient, ProbeResult, ReachabilityListener

log = logging.getLogger(__name__)

_MAX_PROBE_INTERVAL_S = 5.0
_MIN_PROBE_INTERVAL_S = 0.05


class JudgeReadiness(ReachabilityListener):
    """Since when the judge has been unreachable; ready unless longer than ``window_s``."""

    def __init__(self, window_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._since: float | None = None
        self.detail = ""
        self._changed = asyncio.Event()

    @property
    def reachable(self) -> bool:
        return self._since is None

    def unreachable_for(self) -> float:
        """Seconds the judge has been unreachable without interruption (0 when reachable)."""
        return 0.0 if self._since is None else max(0.0, self._clock() - self._since)

    def ready(self) -> bool:
        return self._since is None or self._clock() - self._since <= self.window_s

    def judge_reachable(self) -> None:
        if self._since is not None:
            self._since = None
            self._changed.set()

    def judge_unreachable(self, detail: str) -> None:
        self.detail = detail
        if self._since is None:
            self._since = self._clock()
            self._changed.set()

    async def changed(self) -> None:
        """Wait until reachability flips (returns at once if it did since the last call)."""
        await self._changed.wait()
        self._changed.clear()


class JudgeMonitor:
    """Probes the judge and reports readiness changes; run it as one background task."""

    def __init__(
        self,
        client: JudgeClient,
        readiness: JudgeReadiness,
        *,
        probe: Literal["startup", "off"],
        probe_timeout_s: float,
        on_change: Callable[[bool], Awaitable[None]],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._readiness = readiness
        self._probe = probe
        self._probe_timeout_s = probe_timeout_s
        self._on_change = on_change
        self._sleep = sleep
        self._ready = True
        self.interval_s = min(
            _MAX_PROBE_INTERVAL_S, max(_MIN_PROBE_INTERVAL_S, readiness.window_s / 4)
        )

    @property
    def ready(self) -> bool:
        return self._ready

    async def run(self) -> None:
        cfg, url = self._client.config.judge, self._client.display_url
        facts = {"judge_url": url, "judge_api": cfg.api, "judge_model": cfg.model}
        if self._probe == "startup":
            result = await self._probe_once()
            state = "reachable" if result.reachable else "unreachable"
            log.log(
                logging.INFO if result.reachable else logging.WARNING,
                "judge %s at %s (api %s, model %s): %s",
                state,
                url,
                cfg.api,
                cfg.model,
                result.detail,
                extra={**facts, "judge_event": "probe", "judge_reachable": result.reachable},
            )
        else:
            log.info(
                "judge at %s (api %s, model %s); start-up probe off",
                url,
                cfg.api,
                cfg.model,
                extra={**facts, "judge_event": "configured"},
            )
        while True:
            await self._publish()
            if self._readiness.reachable:
                await self._readiness.changed()
                continue
            await self._sleep(self.interval_s)
            await self._probe_once()

    async def _probe_once(self) -> ProbeResult:
        result = await self._client.probe(self._probe_timeout_s)
        if result.reachable:
            self._readiness.judge_reachable()
        else:
            self._readiness.judge_unreachable(result.detail)
        return result

    async def _publish(self) -> None:
        ready = self._readiness.ready()
        if ready == self._ready:
            return
        self._ready = ready
        if ready:
            log.info(
                "judge reachable again: cohort service SERVING",
                extra={"judge_event": "serving"},
            )
        else:
            log.warning(
                "judge unreachable for %.1fs (> judge_unreachable_window_s=%gs): "
                "cohort service NOT_SERVING: %s",
                self._readiness.unreachable_for(),
                self._readiness.window_s,
                self._readiness.detail,
                extra={"judge_event": "not_serving"},
            )
        await self._on_change(ready)
