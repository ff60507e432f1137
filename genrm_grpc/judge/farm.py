"""The judge farm: which endpoint takes the next judge request, and which are sick.

Sans-IO: the farm holds the endpoints' state and decides; the judge client
(``judge/client.py``) sends the requests and reports what happened; the prober in the
client runs the probes this module asks for. Every decision is a function of the state
and an injectable clock, so tests drive it without sleeping. The endpoint's own state
and the policies are plain data in ``judge/endpoint.py`` (re-exported here).

Routing (``pick``): among the endpoints that may take work (healthy, not avoided, below
their ``max_in_flight``, and, when their vLLM metrics are scraped, without requests
waiting in their own queue while another has none), a request with an affinity key
(the cohort's prompt digest) goes to the first endpoint on a consistent-hash ring from
that key whose in-flight count stays within ``load_factor`` × the mean (consistent
hashing with bounded loads): when the preferred endpoint is over that bound, the next
one on the ring, the same for every pass of the cohort. So one cohort's passes stay on
one node (whose prefix cache then holds the shared conversation) unless that node is
busier than its share, and no node runs above ``load_factor`` × the mean — except at
low load, where a node may hold up to ``load_factor`` × the farm's share of ``capacity``
(the most requests the farm is sent at once: ``judge_max_concurrency``, or the sum of the
endpoints' ``max_in_flight`` when that is smaller) / farm size. The load is bounded from
below once more than half the capacity is in flight: while an endpoint then holds fewer
than (2 − ``load_factor``) × the mean, the next request goes to the least-loaded endpoint
whatever its key, so no node idles behind a skew of the keys (with a few cohorts in
flight, their hashes rarely split evenly).

Passive outlier detection, in the manner of Envoy's: ``consecutive_failures`` failures
in a row on one endpoint (connect errors, HTTP 5xx, request timeouts, streamed requests
without a first token in time, requests that a hedge on another endpoint beat) eject it
for ``base_ejection_s`` × its number of ejections, at most ``max_ejection_s``, never
more than ``max_ejection_percent`` of the farm at once (at least one endpoint of a farm
of two or more may always be ejected; a farm of one is never ejected). An ejected
endpoint is readmitted by an active probe once its ejection time has passed. An
endpoint whose ``/v1/models`` does not list the model is out until it does.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable

from genrm_grpc.judge.endpoint import (
    FAILURE_KINDS,
    LATENCY_SAMPLES,
    Endpoint,
    EndpointState,
    HedgePolicy,
    OutlierPolicy,
)
from genrm_grpc.judge.stats import quantile
from genrm_grpc.judge.views import JudgeView

__all__ = [
    "FAILURE_KINDS",
    "LATENCY_SAMPLES",
    "ROUTINGS",
    "VNODES",
    "Endpoint",
    "EndpointState",
    "Farm",
    "HedgePolicy",
    "OutlierPolicy",
    "farm_for",
]

log = logging.getLogger(__name__)

VNODES = 64
"""Points per endpoint on the hash ring: enough that keys spread evenly over a few nodes."""


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


EventCallback = Callable[[str, Endpoint], None]

#: ``affinity``: the routing above. The others exist to measure it against (``make
#: bench``, "judge farm") and for operators who want them: ``round_robin`` (each request
#: to the next endpoint with room), ``hash`` (a static hash of the cohort key, as NeMo
#: Gym's model server pins a session; ignores load except full endpoints),
#: ``least_loaded`` (fewest in flight, no affinity).
ROUTINGS = ("affinity", "round_robin", "hash", "least_loaded")


class Farm:
    """The endpoints, the ring and the outlier state; see the module docstring."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        max_in_flight: int,
        display: Callable[[str], str],
        capacity: int | None = None,
        load_factor: float = 1.25,
        routing: str = "affinity",
        outliers: OutlierPolicy | None = None,
        hedging: HedgePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: EventCallback | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        #: The most requests in flight farm-wide (the caller's concurrency bound).
        self.capacity = capacity
        self.load_factor = load_factor
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        self.routing = routing
        self._next = 0
        self.outliers = outliers or OutlierPolicy()
        self.hedging = hedging or HedgePolicy()
        self._display = display
        self._clock = clock
        self._on_event = on_event or (lambda _event, _endpoint: None)
        self.endpoints: list[Endpoint] = []
        self._ring: list[tuple[int, Endpoint]] = []
        self._ring_keys: list[int] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._farm_hedge_cache: tuple[int, float | None] = (-1, None)
        self._latency_count = 0
        #: Keyed requests that went to their preferred endpoint, or past it (load bound).
        self.affinity_kept = 0
        self.affinity_spilled = 0
        self.set_urls(urls)
        if not self.endpoints:
            raise ValueError("a judge farm needs at least one endpoint")

    # ------------------------------------------------------------------ membership
    def set_urls(self, urls: Iterable[str]) -> None:
        """The endpoint set (discovery): new URLs join, vanished ones drain and leave."""
        wanted = list(dict.fromkeys(urls))
        known = {e.url: e for e in self.endpoints}
        for url in wanted:
            endpoint = known.get(url)
            if endpoint is None:
                endpoint = Endpoint(url, self._display(url), self.max_in_flight)
                endpoint.points = tuple(_point(f"{url}#{i}") for i in range(VNODES))
                self.endpoints.append(endpoint)
                self._on_event("joined", endpoint)
            elif endpoint.state is EndpointState.DRAINING:
                endpoint.state = EndpointState.HEALTHY
                self._on_event("joined", endpoint)
        for endpoint in self.endpoints:
            if endpoint.url not in wanted and endpoint.state is not EndpointState.DRAINING:
                endpoint.state = EndpointState.DRAINING
                self._on_event("draining", endpoint)
        self._prune()
        self._rebuild_ring()
        self._wake()

    def _prune(self) -> None:
        self.endpoints = [
            e for e in self.endpoints if e.state is not EndpointState.DRAINING or e.in_flight
        ]

    def _rebuild_ring(self) -> None:
        ring = sorted(
            (p, e)
            for e in self.endpoints
            if e.state is not EndpointState.DRAINING
            for p in e.points
        )
        self._ring = ring
        self._ring_keys = [p for p, _ in ring]

    @property
    def size(self) -> int:
        return sum(1 for e in self.endpoints if e.state is not EndpointState.DRAINING)

    def healthy(self) -> list[Endpoint]:
        return [e for e in self.endpoints if e.takes_work]

    # ------------------------------------------------------------------ routing
    def pick(self, key: str | None, avoid: Collection[Endpoint] = ()) -> Endpoint | None:
        """The endpoint for the next request, or None when every candidate is full."""
        if len(self.endpoints) == 1:
            # A farm of one (the common single-URL deployment): whatever its health or
            # what was avoided, it is the only place to send; only its limit applies.
            only = self.endpoints[0]
            if only.state is EndpointState.DRAINING or only.in_flight >= only.max_in_flight:
                return None
            return only
        room = self._room(avoid)
        if not room:
            return None
        if len(room) == 1:
            return room[0]
        if self.routing == "round_robin":
            self._next += 1
            return room[self._next % len(room)]
        if self.routing == "least_loaded" or (key is None and self.routing == "hash"):
            return min(room, key=lambda e: e.in_flight)
        if self.routing == "hash":
            ordered = sorted(room, key=lambda e: e.url)
            return ordered[_point(key or "") % len(ordered)]
        return self._bounded_affinity(key, room)

    def _room(self, avoid: Collection[Endpoint]) -> list[Endpoint]:
        """The endpoints a request may go to now: healthy, not avoided, below their
        limit and, if any, without a queue of their own (empty when all are full)."""
        candidates = [e for e in self.endpoints if e.takes_work and e not in avoid]
        if not candidates:
            candidates = self.healthy()  # every healthy one was avoided: reuse them
        if not candidates:
            # Panic: no healthy endpoint (all ejected or misconfigured). Sending beats
            # holding every pass until a probe readmits one.
            candidates = [e for e in self.endpoints if e.state is not EndpointState.DRAINING]
        room = [e for e in candidates if e.in_flight < e.max_in_flight]
        unqueued = [e for e in room if not e.queue_waiting]
        return unqueued or room

    def _bounded_affinity(self, key: str | None, room: list[Endpoint]) -> Endpoint:
        """``affinity`` routing among two or more endpoints with room (module docstring)."""
        total = sum(e.in_flight for e in room)
        capacity = sum(e.max_in_flight for e in room)
        if self.capacity is not None:
            capacity = min(capacity, self.capacity)
        least = min(room, key=lambda e: e.in_flight)
        mean = (total + 1) / len(room)
        if (
            key is not None
            and 2 * (total + 1) > capacity
            and least.in_flight < (2 - self.load_factor) * mean
        ):
            # The lower bound, once the farm is over half its capacity: an endpoint well
            # under the mean takes the next request, so a skew of the keys in flight does
            # not leave a node idle while the others queue.
            self.affinity_spilled += 1
            return least
        # The bound of consistent hashing with bounded loads, with a floor for a farm at
        # low load: below load_factor x (the farm's capacity / farm size) an endpoint is
        # never over its share (two requests on a half-idle farm cost nothing extra and
        # keep the cohort's prefix on one node).
        bound = max(
            math.ceil(self.load_factor * (total + 1) / len(room)),
            math.ceil(self.load_factor * capacity / len(room)),
        )
        if key is not None and self._ring:
            chosen = self._on_ring(key, set(room), bound)
            if chosen is not None:
                return chosen
            self.affinity_spilled += 1
        return least

    def _on_ring(self, key: str, allowed: set[Endpoint], bound: int) -> Endpoint | None:
        """The first allowed endpoint from ``key`` on the ring within ``bound``, counted
        as kept (the key's preferred endpoint) or spilled; None if all are over it."""
        start = bisect.bisect_left(self._ring_keys, _point(key))
        n = len(self._ring)
        seen: set[int] = set()
        preferred: Endpoint | None = None
        for k in range(n):
            endpoint = self._ring[(start + k) % n][1]
            if id(endpoint) in seen:
                continue
            seen.add(id(endpoint))
            if endpoint in allowed:
                preferred = preferred or endpoint
                # The first node from the key within the bound: a cohort whose
                # preferred node is over its share spills to the same next node.
                if endpoint.in_flight + 1 <= bound:
                    if endpoint is preferred:
                        self.affinity_kept += 1
                    else:
                        self.affinity_spilled += 1
                    return endpoint
            if len(seen) == len(self.endpoints):
                break
        return None

    def take(self, endpoint: Endpoint) -> None:
        endpoint.in_flight += 1
        endpoint.requests += 1

    def try_acquire(self, key: str | None, avoid: Collection[Endpoint] = ()) -> Endpoint | None:
        """``acquire`` without waiting: the endpoint, counted, or None when all are full."""
        endpoint = self.pick(key, avoid)
        if endpoint is not None:
            self.take(endpoint)
        return endpoint

    async def acquire(self, key: str | None, avoid: Collection[Endpoint] = ()) -> Endpoint:
        """Pick an endpoint and count the request on it, waiting while all are full."""
        while True:
            endpoint = self.pick(key, avoid)
            if endpoint is not None:
                self.take(endpoint)
                return endpoint
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def release(self, endpoint: Endpoint) -> None:
        endpoint.in_flight -= 1
        if endpoint.state is EndpointState.DRAINING and not endpoint.in_flight:
            self._prune()
            self._on_event("left", endpoint)
        self._wake()

    def _wake(self, *, every: bool = False) -> None:
        """Wake the first live waiter of ``acquire`` (``every``: all of them)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not every:
                    return

    # ------------------------------------------------------------------ outcomes
    def succeeded(self, endpoint: Endpoint, seconds: float) -> None:
        endpoint.consecutive_failures = 0
        endpoint.latencies.append(seconds)
        endpoint.latency.observe(seconds)
        self.latencies.append(seconds)
        self._latency_count += 1

    def answered(self, endpoint: Endpoint) -> None:
        """An HTTP answer that is not the endpoint's fault (4xx, an unusable verdict)."""
        endpoint.consecutive_failures = 0

    def failed(self, endpoint: Endpoint, kind: str, detail: str) -> None:
        """A request failed in a way that counts against the endpoint (FAILURE_KINDS)."""
        endpoint.failures += 1
        endpoint.consecutive_failures += 1
        endpoint.detail = detail
        if (
            endpoint.state is EndpointState.HEALTHY
            and endpoint.consecutive_failures >= self.outliers.consecutive_failures
            and self._may_eject()
        ):
            self._eject(
                endpoint,
                f"{endpoint.consecutive_failures} consecutive failures (last: {kind}: {detail})",
            )

    def _may_eject(self) -> bool:
        size = self.size
        if size < 2:
            return False
        out = sum(1 for e in self.endpoints if e.state is EndpointState.EJECTED)
        allowed = max(1, math.floor(size * self.outliers.max_ejection_percent / 100))
        return out < allowed

    def _eject(self, endpoint: Endpoint, why: str) -> None:
        endpoint.ejections += 1
        endpoint.ejections_total += 1
        seconds = min(
            self.outliers.max_ejection_s, self.outliers.base_ejection_s * endpoint.ejections
        )
        endpoint.ejected_until = self._clock() + seconds
        endpoint.state = EndpointState.EJECTED
        endpoint.consecutive_failures = 0
        endpoint.detail = why
        self._announce(logging.WARNING, "ejected", endpoint, f"ejected for {seconds:g}s: {why}")

    def wrong_model(self, endpoint: Endpoint, detail: str) -> None:
        """The endpoint answers but does not serve the model: out until it does."""
        if endpoint.state in (EndpointState.WRONG_MODEL, EndpointState.DRAINING):
            endpoint.detail = detail
            return
        endpoint.state = EndpointState.WRONG_MODEL
        endpoint.detail = detail
        endpoint.ejections_total += 1
        self._announce(logging.WARNING, "wrong_model", endpoint, f"taken out: {detail}")

    def readmit(self, endpoint: Endpoint, detail: str) -> None:
        if endpoint.state not in (EndpointState.EJECTED, EndpointState.WRONG_MODEL):
            return
        endpoint.state = EndpointState.HEALTHY
        endpoint.consecutive_failures = 0
        endpoint.detail = detail
        self._announce(logging.INFO, "readmitted", endpoint, f"readmitted: {detail}")
        self._wake(every=True)

    def _announce(self, level: int, event: str, endpoint: Endpoint, text: str) -> None:
        """The one log line of an ejection, a readmission or a wrong model, and the event."""
        log.log(
            level,
            "judge endpoint %s %s",
            endpoint.display,
            text,
            extra={"judge_url": endpoint.display, "judge_event": event},
        )
        self._on_event(event, endpoint)

    def due_for_readmission_probe(self) -> list[Endpoint]:
        now = self._clock()
        return [
            e for e in self.endpoints if e.state is EndpointState.EJECTED and e.ejected_until <= now
        ]

    # ------------------------------------------------------------------ hedging
    def hedge_after(self, endpoint: Endpoint) -> float | None:
        """Seconds after which a request on ``endpoint`` gets a hedge (None: never)."""
        policy = self.hedging
        if policy.fixed_s is not None:
            return policy.fixed_s
        if policy.quantile is None or self.size < 2:
            return None
        if len(endpoint.latencies) >= policy.min_samples:
            return self._cached(endpoint.latencies, endpoint, policy.quantile, policy.floor_s)
        if len(self.latencies) >= policy.min_samples:
            return self._cached(self.latencies, None, policy.quantile, policy.floor_s)
        return None

    def _cached(
        self, samples: deque[float], endpoint: Endpoint | None, q: float, floor: float
    ) -> float:
        # The quantile is recomputed every 16 new samples, not per request (a sort).
        stamp = self._latency_count // 16
        cache = endpoint._hedge_cache if endpoint is not None else self._farm_hedge_cache
        if cache[0] == stamp and cache[1] is not None:
            return cache[1]
        value = max(floor, quantile(samples, q))
        if endpoint is not None:
            endpoint._hedge_cache = (stamp, value)
        else:
            self._farm_hedge_cache = (stamp, value)
        return value


__all__ = [
    "FAILURE_KINDS",
    "Endpoint",
    "EndpointState",
    "Farm",
    "HedgePolicy",
    "OutlierPolicy",
]


def farm_for(config: JudgeView, display: Callable[[str], str], clock: Callable[[], float]) -> Farm:
    """The farm of the configured endpoints, with the judge block's routing policies."""
    judge = config.judge
    return Farm(
        judge.endpoint_urls(),
        max_in_flight=judge.in_flight_per_endpoint(),
        capacity=config.judge_max_concurrency,
        display=display,
        load_factor=judge.affinity_load_factor,
        routing=judge.routing,
        outliers=OutlierPolicy(
            consecutive_failures=judge.outlier_consecutive_failures,
            base_ejection_s=judge.outlier_base_ejection_s,
            max_ejection_s=judge.outlier_max_ejection_s,
            max_ejection_percent=judge.max_ejection_percent,
        ),
        hedging=HedgePolicy(
            fixed_s=config.judge_hedge_after_s,
            quantile=judge.hedge_quantile,
            floor_s=judge.hedge_floor_s,
            min_samples=judge.hedge_min_samples,
        ),
        clock=clock,
    )
