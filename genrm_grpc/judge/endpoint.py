"""One judge endpoint as the farm sees it: its state, load, health and counters, and the
policies (outlier ejection, hedging) the farm applies to it.

Plain data; the decisions are the farm's (``judge/farm.py``, which re-exports these).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from genrm_grpc.judge.stats import Buckets
from genrm_grpc.observability.metrics import JUDGE_BUCKETS

LATENCY_SAMPLES = 256
"""Recent successful request latencies kept per endpoint (and farm-wide) for hedging."""


class EndpointState(enum.StrEnum):
    HEALTHY = "healthy"
    EJECTED = "ejected"
    WRONG_MODEL = "wrong_model"
    #: Gone from discovery: takes no new work, finishes what it holds, then leaves.
    DRAINING = "draining"


#: What a finished request tells outlier detection.
FAILURE_KINDS = frozenset({"transport", "http_5xx", "deadline", "first_token", "slow"})


@dataclass(frozen=True)
class OutlierPolicy:
    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0


@dataclass(frozen=True)
class HedgePolicy:
    """Hedge point per endpoint: ``max(floor_s, quantile of its latencies)``.

    ``fixed_s`` (``judge_hedge_after_s``) overrides the adaptive point; ``quantile``
    None turns adaptive hedging off. Adaptive hedging needs ``min_samples`` latencies of
    the endpoint (or, before it has them, of the whole farm) and a farm of two or more.
    """

    fixed_s: float | None = None
    quantile: float | None = 0.99
    floor_s: float = 2.0
    min_samples: int = 32


@dataclass(eq=False)
class Endpoint:
    """One judge endpoint and what the farm knows about it."""

    url: str
    """As configured (may carry user-info: never log it; use ``display``)."""
    display: str
    max_in_flight: int
    points: tuple[int, ...] = ()
    in_flight: int = 0
    state: EndpointState = EndpointState.HEALTHY
    #: Its last request got an HTTP answer (other than 502/503/504).
    reachable: bool = True
    consecutive_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    detail: str = ""
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    _hedge_cache: tuple[int, float | None] = (-1, None)
    #: From the endpoint's own ``/metrics`` (None: not scraped, or not answered).
    queue_waiting: int | None = None
    queue_running: int | None = None
    kv_usage: float | None = None
    # Counters (read by the metrics collector at scrape time).
    requests: int = 0
    failures: int = 0
    hedges: int = 0
    ejections_total: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    #: Answered requests' latencies, for the per-endpoint histogram.
    latency: Buckets = field(default_factory=lambda: Buckets(JUDGE_BUCKETS))

    @property
    def takes_work(self) -> bool:
        return self.state is EndpointState.HEALTHY
