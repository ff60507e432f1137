"""Prometheus metrics of one server, and the HTTP endpoint that serves them.

Each server owns its own ``CollectorRegistry`` (tests run many servers in one process).
Counters and histograms are updated through the observer hooks as events happen; the
gauges (cohorts by phase, judge queue, tombstones) are read from the runtime at scrape
time (``observability/collectors.py``), so they can never drift from the state they
describe. The endpoint is a small
asyncio HTTP server on the server's own event loop: a scrape reads that state on the
loop thread, never concurrently with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from genrm_grpc.cohort.model import CohortKey, Reason
from genrm_grpc.observability.collectors import FarmCollector, StateCollector, TokenCollector
from genrm_grpc.observability.hooks import CohortOutcome, ComparisonOutcome

if TYPE_CHECKING:
    from genrm_grpc.judge.budget import AdaptiveBudget, TokenLedger
    from genrm_grpc.judge.farm import Farm
    from genrm_grpc.runtime.live import Runtime

log = logging.getLogger(__name__)

# Judge calls of a GenRM reasoning model take seconds to many minutes.
JUDGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
COHORT_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
MEMBER_RESULTS = ("accepted", "attached", "replayed")
UNAUTHENTICATED = "UNAUTHENTICATED"


class ServerMetrics:
    """Every metric of one server; implements the judge and runtime observer hooks."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # Declared in exposition order: cohorts and members, the judge, the service.
        self._declare_cohort_metrics(self.registry)
        self._declare_judge_metrics(self.registry)
        self._declare_service_metrics(self.registry)
        self._start_known_series()
        # Labelled children by label value, filled on first use (see the hooks).
        self._judge_requests: dict[str, Counter] = {}
        self._judge_retries: dict[str, Counter] = {}
        self._judge_comparisons: dict[str, Counter] = {}
        self._cohorts_finished: dict[str, Counter] = {}
        self._cohort_duration: dict[str, Histogram] = {}
        self._members: dict[str, Counter] = {}
        self._members_rejected: dict[str, Counter] = {}
        self._compare_requests: dict[str, Counter] = {}
        self._unauthenticated: dict[str, Counter] = {}
        self._judge_request_observe = self.judge_request_duration.observe
        self._judge_comparison_observe = self.judge_comparison_duration.observe
        self._cohorts_started_inc = self.cohorts_started.inc

    def _declare_cohort_metrics(self, r: CollectorRegistry) -> None:
        self.cohorts_finished = Counter(
            "genrm_cohorts_finished",
            "Cohorts that reached a terminal disposition, by outcome "
            "(completed, masked = judge failed, failed = aborted).",
            ["outcome"],
            registry=r,
        )
        self.cohorts_started = Counter(
            "genrm_cohorts_started", "Cohorts created by a first member.", registry=r
        )
        self.cohort_duration = Histogram(
            "genrm_cohort_duration_seconds",
            "From a cohort's first member to its terminal disposition.",
            ["outcome"],
            buckets=COHORT_BUCKETS,
            registry=r,
        )
        self.members = Counter(
            "genrm_members",
            "Member submissions the server took on, by result "
            "(accepted = new slot, attached = identical resubmission, replayed = cached).",
            ["result"],
            registry=r,
        )
        self.members_rejected = Counter(
            "genrm_members_rejected",
            "Member submissions refused, by ErrorInfo reason.",
            ["reason"],
            registry=r,
        )
        self.masked_results = Counter(
            "genrm_masked_results",
            "Member results returned masked because the judge failed (replays included).",
            registry=r,
        )

    def _declare_judge_metrics(self, r: CollectorRegistry) -> None:
        self.judge_requests = Counter(
            "genrm_judge_requests",
            "Judge HTTP requests by outcome: ok, or the failure kind (http_503, transport, "
            "unparseable, incomplete_max_output_tokens, deadline, ...).",
            ["outcome"],
            registry=r,
        )
        self.judge_request_duration = Histogram(
            "genrm_judge_request_duration_seconds",
            "Duration of one judge HTTP request (one attempt), whatever its outcome.",
            buckets=JUDGE_BUCKETS,
            registry=r,
        )
        self.judge_retries = Counter(
            "genrm_judge_retries",
            "Judge attempts retried, by the cause of the failed attempt.",
            ["cause"],
            registry=r,
        )
        self.judge_comparisons = Counter(
            "genrm_judge_comparisons",
            "Pair comparisons (all attempts of one pair) by outcome: ok, default_verdict "
            "(unparseable after all retries), failed (masks the cohort), cancelled.",
            ["outcome"],
            registry=r,
        )
        self.judge_comparison_duration = Histogram(
            "genrm_judge_comparison_duration_seconds",
            "Duration of one pair comparison including retries and backoff.",
            buckets=JUDGE_BUCKETS,
            registry=r,
        )
        self.judge_hedges = Counter(
            "genrm_judge_hedges",
            "Judge requests hedged: a second, identical request sent because the first was "
            "unanswered after its hedge point (judge_hedge_after_s, or in a farm the "
            "endpoint's latency quantile; the first answer wins).",
            registry=r,
        )
        self.judge_ready = Gauge(
            "genrm_judge_ready",
            "1 while the judge counts as reachable; 0 once it has been unreachable for "
            "longer than judge_unreachable_window_s (the cohort service is NOT_SERVING).",
            registry=r,
        )
        self.judge_ready.set(1)

    def _declare_service_metrics(self, r: CollectorRegistry) -> None:
        self.store_up = Gauge(
            "genrm_store_up",
            "1 while the store answers; 0 while a shared (Redis) store is unreachable "
            "(the cohort service is NOT_SERVING).",
            registry=r,
        )
        self.store_up.set(1)
        self.store_round_trip = Histogram(
            "genrm_store_round_trip_seconds",
            "Replicas on a shared store: duration of one Redis round trip of the replica "
            "protocol (group read, group commit, lease claim or renewal, outcome read).",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.compare_requests = Counter(
            "genrm_compare_requests",
            "Compare calls by outcome (ok, judge_failed, rejected).",
            ["outcome"],
            registry=r,
        )
        self.unauthenticated = Counter(
            "genrm_unauthenticated_requests",
            "Calls refused for a missing or invalid bearer token.",
            ["auth"],
            registry=r,
        )
        self.calls_refused_overloaded = Counter(
            "genrm_calls_refused_overloaded",
            "CohortService calls refused with SERVER_OVERLOADED (max_concurrent_rpcs).",
            registry=r,
        )
        self.calls_in_progress = Gauge(
            "genrm_calls_in_progress",
            "CohortService calls in progress (counted against max_concurrent_rpcs).",
            registry=r,
        )

    def _start_known_series(self) -> None:
        """Known label values start at 0 so that dashboards and rate() see every series."""
        for outcome in ("completed", "masked", "failed"):
            self.cohorts_finished.labels(outcome)
        for result in MEMBER_RESULTS:
            self.members.labels(result)
        for reason in Reason:
            # JUDGE_FAILED (Compare) and COHORT_NOT_FOUND (GetCohort) never refuse a member.
            if reason not in (Reason.JUDGE_FAILED, Reason.COHORT_NOT_FOUND):
                self.members_rejected.labels(reason.value)
        for comparison in ("ok", "default_verdict", "failed", "cancelled"):
            self.judge_comparisons.labels(comparison)
        self.judge_requests.labels("ok")
        for why in ("missing", "invalid"):
            self.unauthenticated.labels(why)

    def attach_runtime(self, runtime: Runtime) -> None:
        """Gauges read from the runtime, the registry and the store at scrape time."""
        self.registry.register(StateCollector(runtime))

    def attach_farm(self, farm: Farm) -> None:
        """Per judge endpoint: load, state, latency, tokens (read at scrape time)."""
        self.registry.register(FarmCollector(farm))

    def attach_tokens(self, ledger: TokenLedger, budget: AdaptiveBudget | None) -> None:
        """Output tokens per verdict, wasted tokens, the adaptive budget (scrape time)."""
        self.registry.register(TokenCollector(ledger, budget))

    # ----------------------------------------------------------------- hooks
    # Every hook runs on the hot path (several per member, several per judge call):
    # ``Counter.labels(value)`` takes a lock and builds a key tuple each time, so the
    # labelled children are looked up once and kept in plain dicts (``_child``). Label
    # values are bounded sets (outcomes, failure kinds, ErrorInfo reasons), so are these.
    def judge_request(self, outcome: str, seconds: float) -> None:
        _child(self._judge_requests, self.judge_requests, outcome).inc()
        self._judge_request_observe(seconds)

    def judge_retry(self, cause: str) -> None:
        _child(self._judge_retries, self.judge_retries, cause).inc()

    def judge_comparison(self, outcome: ComparisonOutcome, seconds: float) -> None:
        _child(self._judge_comparisons, self.judge_comparisons, outcome).inc()
        self._judge_comparison_observe(seconds)

    def judge_hedged(self) -> None:
        self.judge_hedges.inc()

    def judge_readiness(self, ready: bool) -> None:
        self.judge_ready.set(1 if ready else 0)

    def store_availability(self, available: bool) -> None:
        self.store_up.set(1 if available else 0)

    def cohort_started(self, key: CohortKey) -> None:
        self._cohorts_started_inc()

    def cohort_finished(self, key: CohortKey, outcome: CohortOutcome, age_s: float) -> None:
        _child(self._cohorts_finished, self.cohorts_finished, outcome).inc()
        _child(self._cohort_duration, self.cohort_duration, outcome).observe(max(0.0, age_s))

    def member_result(self, result: str) -> None:
        _child(self._members, self.members, result).inc()

    def member_rejected(self, reason: str) -> None:
        _child(self._members_rejected, self.members_rejected, reason).inc()

    def masked_result(self) -> None:
        self.masked_results.inc()

    def compare_finished(self, outcome: str) -> None:
        _child(self._compare_requests, self.compare_requests, outcome).inc()

    def auth_denied(self, why: str) -> None:
        _child(self._unauthenticated, self.unauthenticated, why).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


_Labelled = TypeVar("_Labelled", Counter, Histogram)


def _child(cache: dict[str, _Labelled], parent: _Labelled, value: str) -> _Labelled:
    """The child of ``parent`` for one label value, looked up in ``cache`` first."""
    child = cache.get(value)
    if child is None:
        child = cache[value] = parent.labels(value)
    return child


class MetricsEndpoint:
    """``GET /metrics`` over plain HTTP/1.1 on the event loop (one response per connection)."""

    def __init__(self, exposition: Callable[[], bytes], listen: str) -> None:
        self._exposition = exposition
        host, _, port = listen.rpartition(":")
        self._host = host.strip("[]")
        self._port = int(port)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[object]] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics endpoint listening", extra={"metrics_port": self.port})
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        # A scraper holding a connection open must not outlive the server.
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].split()
            method = parts[0] if parts else b""
            path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
            if method not in (b"GET", b"HEAD"):
                status, body, kind = b"405 Method Not Allowed", b"GET only\n", b"text/plain"
            elif path not in (b"/metrics", b"/"):
                status, body, kind = b"404 Not Found", b"try /metrics\n", b"text/plain"
            else:
                status, body = b"200 OK", self._exposition()
                kind = CONTENT_TYPE_LATEST.encode()
            head_lines = (
                b"HTTP/1.1 " + status,
                b"Content-Type: " + kind,
                b"Content-Length: " + str(len(body)).encode(),
                b"Connection: close",
            )
            writer.write(b"\r\n".join(head_lines) + b"\r\n\r\n")
            if method != b"HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # a half-open, reset or garbage connection: just close it
        except asyncio.LimitOverrunError:
            pass  # request head larger than the stream limit (64 KiB)
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
