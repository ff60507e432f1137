"""Prometheus metrics of one server, and the HTTP endpoint that serves them.

Each server owns its own ``CollectorRegistry`` (tests run many servers in one process).
Counters and histograms are updated through the observer hooks as events happen; the
gauges (cohorts by phase, judge queue, tombstones) are read from the runtime at scrape
time, so they can never drift from the state they describe. The endpoint is a small
asyncio HTTP server on the server's own event loop: a scrape reads that state on the
loop thread, never concurrently with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from genrm_grpc.cohort.model import CohortKey, Phase, Reason
from genrm_grpc.observability.hooks import CohortOutcome, ComparisonOutcome

if TYPE_CHECKING:
    from genrm_grpc.judge.budget import AdaptiveBudget, TokenLedger
    from genrm_grpc.judge.farm import Farm
    from genrm_grpc.runtime.engine import CohortRuntime

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
        r = self.registry
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
        # Known label values start at 0 so that dashboards and rate() see every series.
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

    def attach_runtime(self, runtime: CohortRuntime) -> None:
        """Gauges read from the runtime, the registry and the store at scrape time."""
        self.registry.register(_StateCollector(runtime))

    def attach_farm(self, farm: Farm) -> None:
        """Per judge endpoint: load, state, latency, tokens (read at scrape time)."""
        self.registry.register(_FarmCollector(farm))

    def attach_tokens(self, ledger: TokenLedger, budget: AdaptiveBudget | None) -> None:
        """Output tokens per verdict, wasted tokens, the adaptive budget (scrape time)."""
        self.registry.register(_TokenCollector(ledger, budget))

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


class _TokenCollector(Collector):
    def __init__(self, ledger: TokenLedger, budget: AdaptiveBudget | None) -> None:
        self._ledger = ledger
        self._budget = budget

    def collect(self) -> Iterable[Metric]:
        ledger = self._ledger
        per_verdict = HistogramMetricFamily(
            "genrm_judge_verdict_output_tokens",
            "Output tokens of the judge attempt that produced each verdict.",
        )
        per_verdict.add_metric([], ledger.per_verdict.cumulative(), ledger.per_verdict.total)
        yield per_verdict
        yield _counter(
            "genrm_judge_wasted_output_tokens",
            "Output tokens of judge attempts that produced no verdict (runaways cut by the "
            "budget, unparseable or empty answers).",
            ledger.wasted,
        )
        yield _counter(
            "genrm_judge_adaptive_budget_cuts",
            "Judge attempts that ran out of the adaptive output budget (judge.adaptive_budget) "
            "below the configured max_output_tokens.",
            ledger.adaptive_cuts,
        )
        yield _gauge(
            "genrm_judge_streamed_tokens_in_flight",
            "Output tokens streamed so far by judge requests still in flight (judge.stream).",
            ledger.streamed_in_flight,
        )
        yield _counter(
            "genrm_judge_first_token_timeouts",
            "Streamed judge requests closed for sending no first token within "
            "judge.first_token_timeout_s.",
            ledger.first_token_timeouts,
        )
        if self._budget is not None and self._budget.current() is not None:
            yield _gauge(
                "genrm_judge_adaptive_budget_tokens",
                "The adaptive output budget sent with judge attempts now.",
                self._budget.current() or 0,
            )


class _FarmCollector(Collector):
    """The judge farm, one series per endpoint (label ``endpoint``: its redacted URL)."""

    def __init__(self, farm: Farm) -> None:
        self._farm = farm

    def collect(self) -> Iterable[Metric]:
        from genrm_grpc.judge.farm import EndpointState

        endpoints = list(self._farm.endpoints)
        label = ["endpoint"]
        in_flight = GaugeMetricFamily(
            "genrm_judge_endpoint_in_flight", "Judge requests in flight per endpoint.", labels=label
        )
        state = GaugeMetricFamily(
            "genrm_judge_endpoint_state",
            "1 for the endpoint's current state (healthy, ejected, wrong_model, draining).",
            labels=["endpoint", "state"],
        )
        hedge = GaugeMetricFamily(
            "genrm_judge_endpoint_hedge_after_seconds",
            "Current hedge point of the endpoint (absent: no hedging).",
            labels=label,
        )
        waiting = GaugeMetricFamily(
            "genrm_judge_endpoint_queue_waiting",
            "vllm:num_requests_waiting as last scraped (judge.scrape_metrics_s).",
            labels=label,
        )
        requests = CounterMetricFamily(
            "genrm_judge_endpoint_requests", "Judge requests sent per endpoint.", labels=label
        )
        failures = CounterMetricFamily(
            "genrm_judge_endpoint_failures",
            "Requests that counted against the endpoint (transport, 5xx, deadline, beaten by "
            "a hedge).",
            labels=label,
        )
        hedges = CounterMetricFamily(
            "genrm_judge_endpoint_hedges", "Hedged requests sent to the endpoint.", labels=label
        )
        ejections = CounterMetricFamily(
            "genrm_judge_endpoint_ejections",
            "Times the endpoint was taken out (outlier ejection or wrong model).",
            labels=label,
        )
        tokens = CounterMetricFamily(
            "genrm_judge_endpoint_tokens",
            "Judge tokens per endpoint: input, output, cached (input tokens the judge served "
            "from its prefix cache).",
            labels=["endpoint", "kind"],
        )
        latency = HistogramMetricFamily(
            "genrm_judge_endpoint_request_seconds",
            "Latency of the endpoint's answered (2xx) requests.",
            labels=label,
        )
        for e in endpoints:
            name = [e.display]
            in_flight.add_metric(name, e.in_flight)
            for s in EndpointState:
                state.add_metric([e.display, s.value], int(e.state is s))
            point = self._farm.hedge_after(e)
            if point is not None:
                hedge.add_metric(name, point)
            if e.queue_waiting is not None:
                waiting.add_metric(name, e.queue_waiting)
            requests.add_metric(name, e.requests)
            failures.add_metric(name, e.failures)
            hedges.add_metric(name, e.hedges)
            ejections.add_metric(name, e.ejections_total)
            tokens.add_metric([e.display, "input"], e.input_tokens)
            tokens.add_metric([e.display, "output"], e.output_tokens)
            tokens.add_metric([e.display, "cached"], e.cached_tokens)
            latency.add_metric(name, e.latency.cumulative(), e.latency.total)
        affinity = CounterMetricFamily(
            "genrm_judge_affinity",
            "Judge requests with a cohort key: sent to the cohort's preferred endpoint "
            "(kept) or past it because it was over the load bound (spilled).",
            labels=["result"],
        )
        affinity.add_metric(["kept"], self._farm.affinity_kept)
        affinity.add_metric(["spilled"], self._farm.affinity_spilled)
        yield affinity
        yield from (
            in_flight,
            state,
            hedge,
            waiting,
            requests,
            failures,
            hedges,
            ejections,
            tokens,
            latency,
        )


class _StateCollector(Collector):
    def __init__(self, runtime: CohortRuntime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        runtime = self._runtime
        registry = runtime.registry
        census = runtime.census()
        by_phase = GaugeMetricFamily("genrm_cohorts", "Active cohorts by phase.", labels=["phase"])
        by_phase.add_metric([Phase.COLLECTING.value], census.collecting)
        by_phase.add_metric([Phase.EVALUATING.value], census.evaluating)
        yield by_phase
        stats: Mapping[str, int] = runtime.stats()
        yield _gauge("genrm_active_cohorts", "Cohorts not yet terminal.", stats["active_cohorts"])
        yield _gauge(
            "genrm_judge_queue_depth",
            "Judge comparisons waiting for a permit (judge_max_concurrency).",
            stats["judge_waiting"],
        )
        yield _gauge(
            "genrm_judge_in_flight", "Judge comparisons holding a permit.", stats["judge_in_flight"]
        )
        yield _gauge("genrm_waiters", "Calls waiting for their cohort's outcome.", stats["waiters"])
        yield _gauge(
            "genrm_tombstones",
            "Retained terminal cohorts (bounded by max_terminal_cohorts, cohort_result_ttl_s).",
            census.tombstones,
        )
        yield _gauge(
            "genrm_attempt_watermarks",
            "Retained newest-attempt watermarks of explicit groups.",
            census.watermarks,
        )
        yield _gauge(
            "genrm_draining", "1 while the server is shutting down.", int(registry.draining)
        )
        yield _counter(
            "genrm_judge_passes_reused",
            "Judge passes answered from the verdict journal of an earlier attempt of the group.",
            stats["passes_reused"],
        )
        yield _counter(
            "genrm_judge_passes_resumed",
            "Judge passes answered from the verdict journal after a restart.",
            stats["passes_resumed"],
        )
        yield _counter(
            "genrm_store_write_failures",
            "Store writes that failed (the calls depending on them got STORE_UNAVAILABLE).",
            stats["store_failures"],
        )
        if "takeovers" not in stats:
            return
        # Replicas on a shared store (docs/scaling.md): this replica's share of the work.
        for name, key, documentation in (
            (
                "genrm_replica_takeovers",
                "takeovers",
                "Evaluations this replica took over after another replica's lease expired.",
            ),
            (
                "genrm_replica_leases_lost",
                "leases_lost",
                "Evaluation leases this replica lost (renewal refused or Redis unreachable "
                "past the lease): it stopped judging that cohort.",
            ),
            (
                "genrm_replica_lease_renewals",
                "lease_renewals",
                "Evaluation lease renewals by this replica.",
            ),
            ("genrm_replica_group_commits", "group_commits", "Group commits this replica sent."),
            (
                "genrm_replica_commit_conflicts",
                "commit_conflicts",
                "Group commits refused because another replica changed the group first "
                "(decided again on the new state).",
            ),
        ):
            yield _counter(name, documentation, stats[key])
        yield _gauge(
            "genrm_replica_evaluating",
            "Cohorts this replica is evaluating under its lease.",
            stats["evaluating_here"],
        )


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


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
