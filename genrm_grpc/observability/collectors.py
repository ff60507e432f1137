"""The gauges and counters read at scrape time, from the state they describe.

Each collector is registered on a server's ``CollectorRegistry`` by
``ServerMetrics.attach_*`` (``observability/metrics.py``) and reads the runtime, the
judge farm or the token ledger on the event loop thread when ``/metrics`` is scraped,
so these series can never drift from that state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from genrm_grpc.cohort.model import Phase

if TYPE_CHECKING:
    from genrm_grpc.judge.budget import AdaptiveBudget, TokenLedger
    from genrm_grpc.judge.endpoint import Endpoint
    from genrm_grpc.judge.farm import Farm
    from genrm_grpc.runtime.live import Census, Runtime


class TokenCollector(Collector):
    """The judge's output tokens and the adaptive budget (``judge/budget.py``)."""

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


class _EndpointFamilies(NamedTuple):
    """The per-endpoint metric families of one scrape, in exposition order."""

    in_flight: GaugeMetricFamily
    state: GaugeMetricFamily
    hedge: GaugeMetricFamily
    waiting: GaugeMetricFamily
    requests: CounterMetricFamily
    failures: CounterMetricFamily
    hedges: CounterMetricFamily
    ejections: CounterMetricFamily
    tokens: CounterMetricFamily
    latency: HistogramMetricFamily


def _endpoint_families() -> _EndpointFamilies:
    label = ["endpoint"]
    return _EndpointFamilies(
        in_flight=GaugeMetricFamily(
            "genrm_judge_endpoint_in_flight", "Judge requests in flight per endpoint.", labels=label
        ),
        state=GaugeMetricFamily(
            "genrm_judge_endpoint_state",
            "1 for the endpoint's current state (healthy, ejected, wrong_model, draining).",
            labels=["endpoint", "state"],
        ),
        hedge=GaugeMetricFamily(
            "genrm_judge_endpoint_hedge_after_seconds",
            "Current hedge point of the endpoint (absent: no hedging).",
            labels=label,
        ),
        waiting=GaugeMetricFamily(
            "genrm_judge_endpoint_queue_waiting",
            "vllm:num_requests_waiting as last scraped (judge.scrape_metrics_s).",
            labels=label,
        ),
        requests=CounterMetricFamily(
            "genrm_judge_endpoint_requests", "Judge requests sent per endpoint.", labels=label
        ),
        failures=CounterMetricFamily(
            "genrm_judge_endpoint_failures",
            "Requests that counted against the endpoint (transport, 5xx, deadline, beaten by "
            "a hedge).",
            labels=label,
        ),
        hedges=CounterMetricFamily(
            "genrm_judge_endpoint_hedges", "Hedged requests sent to the endpoint.", labels=label
        ),
        ejections=CounterMetricFamily(
            "genrm_judge_endpoint_ejections",
            "Times the endpoint was taken out (outlier ejection or wrong model).",
            labels=label,
        ),
        tokens=CounterMetricFamily(
            "genrm_judge_endpoint_tokens",
            "Judge tokens per endpoint: input, output, cached (input tokens the judge served "
            "from its prefix cache).",
            labels=["endpoint", "kind"],
        ),
        latency=HistogramMetricFamily(
            "genrm_judge_endpoint_request_seconds",
            "Latency of the endpoint's answered (2xx) requests.",
            labels=label,
        ),
    )


class FarmCollector(Collector):
    """The judge farm, one series per endpoint (label ``endpoint``: its redacted URL)."""

    def __init__(self, farm: Farm) -> None:
        self._farm = farm

    def collect(self) -> Iterable[Metric]:
        families = _endpoint_families()
        for endpoint in list(self._farm.endpoints):
            self._add(families, endpoint)
        affinity = CounterMetricFamily(
            "genrm_judge_affinity",
            "Judge requests with a cohort key: sent to the cohort's preferred endpoint "
            "(kept) or past it because it was over the load bound (spilled).",
            labels=["result"],
        )
        affinity.add_metric(["kept"], self._farm.affinity_kept)
        affinity.add_metric(["spilled"], self._farm.affinity_spilled)
        yield affinity
        yield from families

    def _add(self, f: _EndpointFamilies, e: Endpoint) -> None:
        from genrm_grpc.judge.endpoint import EndpointState

        name = [e.display]
        f.in_flight.add_metric(name, e.in_flight)
        for s in EndpointState:
            f.state.add_metric([e.display, s.value], int(e.state is s))
        point = self._farm.hedge_after(e)
        if point is not None:
            f.hedge.add_metric(name, point)
        if e.queue_waiting is not None:
            f.waiting.add_metric(name, e.queue_waiting)
        f.requests.add_metric(name, e.requests)
        f.failures.add_metric(name, e.failures)
        f.hedges.add_metric(name, e.hedges)
        f.ejections.add_metric(name, e.ejections_total)
        f.tokens.add_metric([e.display, "input"], e.input_tokens)
        f.tokens.add_metric([e.display, "output"], e.output_tokens)
        f.tokens.add_metric([e.display, "cached"], e.cached_tokens)
        f.latency.add_metric(name, e.latency.cumulative(), e.latency.total)


#: Replicas on a shared store (docs/scaling.md): this replica's share of the work, as
#: (metric, ``runtime.stats()`` key, documentation).
_REPLICA_COUNTERS = (
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
)


class StateCollector(Collector):
    """The runtime's, registry's and store's state, read at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        runtime = self._runtime
        census = runtime.census()
        by_phase = GaugeMetricFamily("genrm_cohorts", "Active cohorts by phase.", labels=["phase"])
        by_phase.add_metric([Phase.COLLECTING.value], census.collecting)
        by_phase.add_metric([Phase.EVALUATING.value], census.evaluating)
        yield by_phase
        stats: Mapping[str, int] = runtime.stats()
        yield from self._cohorts(census, stats)
        yield from self._journal(stats)
        if "takeovers" not in stats:
            return
        for name, key, documentation in _REPLICA_COUNTERS:
            yield _counter(name, documentation, stats[key])
        yield _gauge(
            "genrm_replica_evaluating",
            "Cohorts this replica is evaluating under its lease.",
            stats["evaluating_here"],
        )

    def _cohorts(self, census: Census, stats: Mapping[str, int]) -> Iterator[Metric]:
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
        draining = int(self._runtime.draining)
        yield _gauge("genrm_draining", "1 while the server is shutting down.", draining)

    @staticmethod
    def _journal(stats: Mapping[str, int]) -> Iterator[Metric]:
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


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
