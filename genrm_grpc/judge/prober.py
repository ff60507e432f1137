"""The farm's active side: readmission probes, the model check, vLLM ``/metrics`` scrapes.

One background task per server (:class:`FarmProber`). Once a second it

* probes every ejected endpoint whose ejection time has passed (``JudgeClient.health``:
  ``/health``, then the model in ``/v1/models``) and readmits it when the probe passes,
  else keeps it out for another ``probe_interval_s``;
* every ``judge.probe_interval_s`` asks every endpoint's ``/v1/models``: one that stopped
  listing ``judge.model`` is taken out, one that lists it again comes back;
* every ``judge.scrape_metrics_s`` (when set) reads each endpoint's Prometheus
  ``/metrics`` for ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and the
  KV-cache usage; the farm then gives no new request to an endpoint with requests
  waiting in its own queue while another has none. Parsing runs in a worker thread.

While no endpoint is healthy, readiness hears "unreachable" (the cohort service turns
NOT_SERVING after ``judge_unreachable_window_s``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from genrm_grpc.judge.client import JudgeClient, ReachabilityListener
from genrm_grpc.judge.farm import Endpoint, EndpointState

log = logging.getLogger(__name__)

TICK_S = 1.0
METRICS_BYTES = 4 * 1024 * 1024

#: vLLM's names (``kv_cache_usage_perc`` since v0.10, ``gpu_cache_usage_perc`` before).
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def read_vllm_load(text: str) -> tuple[int | None, int | None, float | None]:
    """(waiting, running, KV usage 0..1) summed over a vLLM exposition's label sets."""
    waiting: float | None = None
    running: float | None = None
    kv: float | None = None
    for family in text_string_to_metric_families(text):
        if family.name not in (WAITING, RUNNING, *KV_USAGE):
            continue
        values = [s.value for s in family.samples if math.isfinite(s.value)]
        if not values:
            continue
        if family.name == WAITING:
            waiting = sum(values)
        elif family.name == RUNNING:
            running = sum(values)
        elif kv is None or family.name == KV_USAGE[0]:
            kv = max(values)
    return (
        None if waiting is None else int(waiting),
        None if running is None else int(running),
        kv,
    )


class FarmProber:
    def __init__(
        self,
        client: JudgeClient,
        reachability: ReachabilityListener,
        *,
        probe_interval_s: float,
        probe_timeout_s: float,
        scrape_metrics_s: float | None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._farm = client.farm
        self._reachability = reachability
        self._interval = probe_interval_s
        self._timeout = probe_timeout_s
        self._scrape = scrape_metrics_s
        self._sleep = sleep
        self._clock = clock

    async def run(self) -> None:
        tick = min(TICK_S, self._interval, self._scrape or TICK_S)
        now = self._clock()
        next_models = now + self._interval
        next_scrape = now
        while True:
            now = self._clock()
            work = [self._readmit(e) for e in self._farm.due_for_readmission_probe()]
            if now >= next_models:
                next_models = now + self._interval
                work += [
                    self._check_model(e)
                    for e in self._farm.endpoints
                    if e.state in (EndpointState.HEALTHY, EndpointState.WRONG_MODEL)
                ]
            if self._scrape is not None and now >= next_scrape:
                next_scrape = now + self._scrape
                work += [
                    self._scrape_one(e)
                    for e in self._farm.endpoints
                    if e.state is not EndpointState.DRAINING
                ]
            if work:
                await asyncio.gather(*work)
            if not self._farm.healthy():
                self._reachability.judge_unreachable(
                    "no judge endpoint is healthy: "
                    + "; ".join(f"{e.display} {e.state}: {e.detail}" for e in self._farm.endpoints)
                )
            await self._sleep(tick)

    async def _readmit(self, endpoint: Endpoint) -> None:
        why = await self._client.health(endpoint, self._timeout)
        if why is None:
            self._farm.readmit(endpoint, "probe passed")
            endpoint.reachable = True
            self._reachability.judge_reachable()
        else:
            endpoint.ejected_until = self._clock() + self._interval
            endpoint.detail = f"probe failed: {why}"

    async def _check_model(self, endpoint: Endpoint) -> None:
        answer = await self._client.models(endpoint, self._timeout)
        if answer.state == "not_served":
            self._farm.wrong_model(endpoint, self._client.not_served(answer))
        elif answer.state in ("served", "unknown") and endpoint.state is EndpointState.WRONG_MODEL:
            self._farm.readmit(endpoint, answer.detail)

    async def _scrape_one(self, endpoint: Endpoint) -> None:
        status, raw = await self._client.get(
            endpoint, "/metrics", self._timeout, limit=METRICS_BYTES
        )
        if status != 200:
            endpoint.queue_waiting = endpoint.queue_running = endpoint.kv_usage = None
            return
        text = raw.decode("utf-8", "replace")
        try:
            load = await asyncio.get_running_loop().run_in_executor(None, read_vllm_load, text)
        except ValueError:
            load = (None, None, None)
        endpoint.queue_waiting, endpoint.queue_running, endpoint.kv_usage = load


__all__ = ["FarmProber", "read_vllm_load"]
