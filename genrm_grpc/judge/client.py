"""The judge client: one pairwise comparison against an OpenAI-compatible GenRM server.

A comparison is one logical call, ``JudgeClient.judge``, that may cost several HTTP
attempts. Every attempt draws on one shared budget (``genrm_parse_retries`` retries, so
``parse_retries + 1`` attempts): malformed, oversized, empty or budget-exhausted answers,
HTTP 408/429/5xx, connection failures, interrupted bodies and invalid JSON bodies all
spend it. Other HTTP errors (400, 401, 404, ...) and an expired per-request deadline fail
at once.

When the budget is spent, ``scoring.verdict.after_failed_attempt`` decides, as NeMo
Gym's genrm_compare does (the table is in docs/protocol.md):

* the last attempt got no answer (HTTP 408/429/5xx, a connection failure, an
  interrupted or non-JSON body) → ``JudgeFailedError``, whatever the earlier attempts
  ended in;
* the last attempt got an answer without a verdict (unparseable, empty, incomplete) →
  the neutral default verdict, flagged ``parse_failed`` (GenRM convention), if *some*
  attempt got a completed, non-empty answer that did not parse into a verdict (or an
  answer over ``max_response_bytes``), in any order; else ``JudgeFailedError``.

The caller masks the group on ``JudgeFailedError`` instead of inventing a reward.

Outage tolerance (``judge_outage_tolerance_s`` > 0): connection failures, resets, interrupted
bodies, HTTP 502/503/504 and per-request timeouts are retried with the same backoff for
up to that many seconds of continuous outage without spending the budget. Hedging
(``judge_hedge_after_s``): an attempt still unanswered after that long gets a second, identical
request; the first to come back is used and the other is cancelled.

Streaming (``judge.stream``, docs/judge-tokens.md): answers are read as server-sent
events and reassembled (``judge/sse.py``) into the body a non-streamed answer decodes
to, so that parsing and every rule above are unchanged. No generated token within
``judge.first_token_timeout_s`` closes the request, counts against its endpoint and is
treated as a request timeout (retried elsewhere in a farm, final with one endpoint).
The tokens streamed so far count towards ``JudgeInput.progress`` and
``TokenLedger.streamed_in_flight``.

Two wire formats are spoken (docs/protocol.md): ``responses``
(NeMo Gym's GenRM model server, answers in ``metadata``) and ``chat_completions``
(vLLM serving the GenRM chat template, answers as ``response_1``/``response_2`` roles).

The HTTP library is aiohttp (one ``ClientSession`` with a keep-alive ``TCPConnector``),
chosen by measurement: see "Judge client" in docs/performance.md.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import email.utils
import json
import logging
import math
import os
import random as _random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC
from types import TracebackType
from typing import Any, Literal, Protocol, Self

import aiohttp
import orjson

from genrm_grpc.judge.budget import AdaptiveBudget, TokenLedger
from genrm_grpc.judge.farm import Endpoint, EndpointState, Farm, HedgePolicy, OutlierPolicy
from genrm_grpc.judge.redact import Redactor, redact_url, split_userinfo
from genrm_grpc.judge.sse import SSEAnswer, StreamError, StreamTooLarge
from genrm_grpc.observability.hooks import ComparisonOutcome, JudgeObserver, NullJudgeObserver
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.scoring.verdict import (
    AttemptEnd,
    AttemptsDecision,
    after_failed_attempt,
    parse_verdict,
)

logger = logging.getLogger(__name__)

JudgeApi = Literal["responses", "chat_completions"]

MAX_REASON_CHARS = 2000
"""Failure reasons travel to collectors in ``failure_reason``; the protocol caps them."""

OFFLOAD_BYTES = 64 * 1024
"""Bodies at least this large are decoded and parsed in a worker thread, not on the loop."""

_EXCERPT_CHARS = 300
_RETRYABLE_STATUSES = frozenset({408, 429})
_OUTAGE_STATUSES = frozenset({502, 503, 504})
_READ_CHUNK = 64 * 1024
_MODELS_BYTES = 1024 * 1024
# Exponent cap for the backoff so that 2**n never overflows a float.
_MAX_BACKOFF_EXPONENT = 60


class JudgeBlockView(Protocol):
    """The ``judge:`` block as the client reads it (``JudgeSettings`` satisfies it).

    ``url`` is the server's base URL, with or without a trailing ``/v1``; user-info in it
    (``user:password@``) is sent as HTTP Basic authentication and redacted everywhere.
    ``max_retry_sleep_s`` caps the doubling backoff; ``max_response_bytes`` caps one
    response body; ``api_key()`` reads the key from the variable ``api_key_env`` names.
    """

    @property
    def url(self) -> str: ...
    @property
    def api(self) -> JudgeApi: ...
    @property
    def model(self) -> str: ...
    @property
    def max_output_tokens(self) -> int | None: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def max_retry_sleep_s(self) -> float: ...
    @property
    def max_response_bytes(self) -> int: ...
    @property
    def affinity_load_factor(self) -> float: ...
    @property
    def routing(self) -> str: ...
    @property
    def adaptive_budget(self) -> bool: ...
    @property
    def adaptive_budget_quantile(self) -> float: ...
    @property
    def adaptive_budget_margin(self) -> float: ...
    @property
    def adaptive_budget_floor(self) -> int: ...
    @property
    def adaptive_budget_min_samples(self) -> int: ...
    @property
    def stream(self) -> bool: ...
    @property
    def first_token_timeout_s(self) -> float | None: ...
    @property
    def outlier_consecutive_failures(self) -> int: ...
    @property
    def outlier_base_ejection_s(self) -> float: ...
    @property
    def outlier_max_ejection_s(self) -> float: ...
    @property
    def max_ejection_percent(self) -> float: ...
    @property
    def hedge_quantile(self) -> float | None: ...
    @property
    def hedge_floor_s(self) -> float: ...
    @property
    def hedge_min_samples(self) -> int: ...
    def api_key(self) -> str | None: ...
    def endpoint_urls(self) -> tuple[str, ...]: ...
    def in_flight_per_endpoint(self) -> int: ...


class JudgeView(Protocol):
    """The settings the judge client reads: a read-only scoped view of ``Settings``.

    Every key is declared, defaulted and validated once, in ``genrm_grpc.config``.
    ``judge_request_timeout_s`` bounds each HTTP attempt end to end: pool wait, connect
    and connection retries, sending, and reading the whole body. ``genrm_parse_retries``
    is the one retry budget of a comparison. ``genrm_parse_retry_sleep_s`` is the first
    backoff ceiling; it doubles per retry up to ``judge.max_retry_sleep_s`` and the actual
    wait is drawn uniformly below it (full jitter). ``judge_outage_tolerance_s`` and
    ``judge_hedge_after_s`` are described in the module docstring.
    ``judge_max_concurrency`` (the runtime's bound on comparisons in flight) is the
    farm's capacity in its load bound.
    """

    @property
    def judge(self) -> JudgeBlockView: ...
    @property
    def judge_request_timeout_s(self) -> float: ...
    @property
    def genrm_parse_retries(self) -> int: ...
    @property
    def genrm_parse_retry_sleep_s(self) -> float: ...
    @property
    def default_score(self) -> float: ...
    @property
    def default_ranking(self) -> float: ...
    @property
    def judge_outage_tolerance_s(self) -> float: ...
    @property
    def judge_hedge_after_s(self) -> float | None: ...
    @property
    def judge_max_concurrency(self) -> int: ...


def judge_base_url(url: str) -> str:
    """The judge's base URL without user-info and without a ``/v1`` suffix."""
    base = split_userinfo(url)[0].rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def judge_endpoint(url: str, api: JudgeApi) -> str:
    """The full URL that judge requests are POSTed to (no user-info)."""
    path = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    return judge_base_url(url) + path


@dataclass(frozen=True)
class JudgeInput:
    """What the judge sees for one ordered pair: the conversation and two answers."""

    messages: tuple[tuple[str, str], ...]
    response_1: str
    response_2: str
    principle: str | None = None
    #: Requests with the same key prefer one endpoint of a farm (the cohort's prompt
    #: digest: its passes share the conversation, which that node's prefix cache holds).
    affinity: str | None = None
    #: Where the client counts this comparison while it is in flight (the cohort's).
    progress: JudgeProgress | None = field(default=None, compare=False)


class JudgeProgress:
    """In-flight judge work of one owner (a cohort), kept up to date by the client.

    ``in_flight``: its comparisons in flight; ``tokens``: output tokens its in-flight
    requests have streamed so far (``judge.stream``; each streamed event that carries
    generated text counts one, as vLLM sends one event per decode step). Updated in
    O(1) per event and read by ``GetCohort``: nothing scans the cohorts."""

    __slots__ = ("in_flight", "tokens")

    def __init__(self) -> None:
        self.in_flight = 0
        self.tokens = 0


@dataclass(frozen=True)
class TokenUsage:
    """Judge tokens spent on one comparison, summed over all of its HTTP attempts."""

    input_tokens: int
    output_tokens: int
    reasoning_tokens: int = 0
    #: Prompt tokens the judge served from its prefix cache (when it reports them).
    cached_tokens: int = 0
    #: Output tokens of attempts that produced no verdict (included in output_tokens).
    wasted_output_tokens: int = 0
    #: Attempts cut short by the adaptive budget (``judge.adaptive_budget``).
    adaptive_cuts: int = 0


@dataclass(frozen=True)
class JudgeOutcome:
    """A verdict (in the caller's order, even when sent swapped) and what it cost."""

    verdict: Verdict
    usage: TokenUsage | None
    attempts: int
    #: Output tokens of attempts that produced no verdict.
    wasted_output_tokens: int = 0
    #: Attempts that ran out of an adaptive budget below the configured cap.
    adaptive_cuts: int = 0


class JudgeFailedError(Exception):
    """The judge gave no usable answer; ``reason`` says why (at most 2000 characters).

    The reason names the failure class and HTTP status, never the judge's address."""

    def __init__(self, reason: str, *, kind: str = "failed") -> None:
        self.reason = _truncate(reason, MAX_REASON_CHARS)
        #: What ended the attempt (``deadline``, ``http_400``, ...), for metrics.
        self.kind = kind
        super().__init__(self.reason)


@dataclass(frozen=True)
class ModelsAnswer:
    """One endpoint's ``/v1/models``: ``served``, ``not_served``, ``unknown`` (no list:
    a server without the route) or ``unreachable``."""

    state: Literal["served", "not_served", "unknown", "unreachable"]
    names: tuple[str, ...]
    detail: str


@dataclass(frozen=True)
class ModelCheck:
    """The start-up model check of every endpoint."""

    model: str
    answers: tuple[tuple[Endpoint, ModelsAnswer], ...]

    @property
    def fatal(self) -> bool:
        """Some endpoint listed its models and none serves the model: nothing would work."""
        states = {a.state for _, a in self.answers}
        return "not_served" in states and not states & {"served", "unknown"}

    def summary(self) -> str:
        parts = [f"{e.display} {a.detail}" for e, a in self.answers]
        return f"judge.model {self.model!r} is served by no judge endpoint: " + "; ".join(parts)


@dataclass(frozen=True)
class ProbeResult:
    """One readiness probe: did the judge answer HTTP at all, and what happened."""

    reachable: bool
    detail: str


class ReachabilityListener:
    """Told whether judge requests reach the judge; the default ignores it."""

    def judge_reachable(self) -> None:
        """An HTTP answer came back (any status except 502/503/504)."""

    def judge_unreachable(self, detail: str) -> None:
        """A request could not connect, was reset, timed out or got 502/503/504."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP-date).

    Returns ``None`` when the header is absent or unreadable; never negative.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


class _AttemptFailed(Exception):
    """One HTTP attempt that did not yield a verdict but may be retried.

    ``answered``: the judge completed an answer (that did not parse, or was too large),
    which turns an exhausted budget into the default verdict. ``outage``: a failure that
    ``outage_tolerance_s`` covers. ``log_detail`` may name addresses (operators only).
    """

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        retry_after: float | None = None,
        answered: bool = False,
        outage: bool = False,
        log_detail: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after
        self.answered = answered
        self.outage = outage
        self.log_detail = detail if log_detail is None else log_detail
        #: Set by the client: whether this failure spent the retry budget.
        self.spent_budget = True
        #: Set by the client when this failure ended the comparison.
        self.decision: AttemptsDecision = "judge_failed"
        #: The endpoint the attempt failed on, when the failure is its (retry elsewhere).
        self.endpoint: Endpoint | None = None


_ANSWER_KINDS = frozenset({"empty_answer", "incomplete", "incomplete_max_output_tokens"})
"""Failure kinds of an attempt the judge answered (HTTP 2xx) without a completed answer."""


def _attempt_end(failure: _AttemptFailed) -> AttemptEnd:
    """How a failed attempt ended, in the terms of ``after_failed_attempt``."""
    if failure.answered:
        return "unparseable"
    if failure.kind in _ANSWER_KINDS:
        return "unusable_answer"
    return "no_answer"


class _Deadline(Exception):
    """The per-request deadline expired (final unless the outage tolerance covers it)."""


@dataclass
class _Tally:
    """Book-keeping for one comparison across its attempts."""

    attempts: int = 0
    budget_spent: int = 0
    answered: bool = False
    outage_since: float | None = None
    usage_seen: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    budget_exhausted: int = 0
    #: The output budget the current attempt was sent with, and whether it was adaptive.
    limit: int | None = None
    adaptive: bool = False
    adaptive_cuts: int = 0
    #: Output tokens of the latest attempt, and of attempts that produced no verdict.
    last_output: int = 0
    wasted_output: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    #: The comparison's owner's in-flight counts (``JudgeInput.progress``).
    progress: JudgeProgress | None = None

    def add_usage(self, usage: TokenUsage) -> None:
        self.usage_seen = True
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.cached_tokens += usage.cached_tokens

    def usage(self) -> TokenUsage | None:
        if not self.usage_seen:
            return None
        return TokenUsage(
            self.input_tokens,
            self.output_tokens,
            self.reasoning_tokens,
            self.cached_tokens,
            self.wasted_output,
            self.adaptive_cuts,
        )


class _Backoff:
    """Exponential backoff with full jitter that never undercuts a ``Retry-After``.

    After the n-th failed attempt the ceiling is ``first * 2**(n-1)`` capped at ``cap``
    and the wait is drawn uniformly from ``[0, ceiling)``. A server's ``Retry-After``
    raises the wait to at least that many seconds, still capped at ``cap`` so one
    overloaded judge cannot park a comparison beyond the configured maximum.
    """

    def __init__(self, first: float, cap: float, random: Callable[[], float]) -> None:
        self._first = first
        self._cap = cap
        self._random = random

    def wait(self, attempt_number: int, failure: _AttemptFailed) -> float:
        exponent = min(attempt_number - 1, _MAX_BACKOFF_EXPONENT)
        ceiling = min(self._cap, self._first * 2.0**exponent)
        wait = self._random() * ceiling
        if failure.retry_after is not None:
            wait = max(wait, min(failure.retry_after, self._cap))
        return wait


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    retry_after: str | None
    endpoint: Endpoint | None = None
    #: A streamed answer, reassembled into the object a non-streamed answer decodes to.
    streamed: Any = None
    #: Bytes of the streamed answer's text (what is offloaded past ``offload_bytes``).
    streamed_bytes: int = 0


@dataclass(frozen=True)
class _Wire:
    """Where and how one endpoint is called (user-info turned into a header)."""

    post_url: str
    base_url: str
    headers: dict[str, str] | None


@dataclass(frozen=True)
class _Answer:
    """A decoded 2xx body: the verdict (or None), the answer's state and its usage."""

    text: str
    state: str
    verdict: Verdict | None
    usage: TokenUsage | None


class JudgeClient:
    """Asks the GenRM judge to compare two answers, with retries and a typed failure.

    Owns one ``aiohttp.ClientSession`` (created on first use, inside the running loop)
    whose keep-alive pool holds ``max_connections`` connections; share one instance
    across comparisons and close it with ``aclose()`` (or use it as an async context
    manager). A comparison waiting for a free connection spends its request deadline
    doing so. ``sleep``, ``random`` and ``clock`` are injectable so tests can record
    backoff waits instead of sleeping and drive the outage window. Response bodies of
    ``offload_bytes`` or more are decoded and parsed on ``executor`` (default: the
    loop's default thread pool). ``reachability`` hears whether requests reach the
    judge; ``on_hedge`` is called for every hedged request.
    """

    def __init__(
        self,
        config: JudgeView,
        *,
        connect_retries: int = 2,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
        clock: Callable[[], float] = time.monotonic,
        observer: JudgeObserver | None = None,
        reachability: ReachabilityListener | None = None,
        on_hedge: Callable[[], None] | None = None,
        offload_bytes: int = OFFLOAD_BYTES,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        if connect_retries < 0:
            raise ValueError(f"connect_retries must be >= 0, got {connect_retries}")
        self._config = config
        self._connect_retries = connect_retries
        self._offload_bytes = offload_bytes
        self._executor = executor
        self._observer: JudgeObserver = observer or NullJudgeObserver()
        self._reachability = reachability or ReachabilityListener()
        self._on_hedge = on_hedge or (lambda: None)
        judge = config.judge
        urls = judge.endpoint_urls()
        #: The configured endpoints as they may be logged: user-info replaced by ``***``.
        self.display_url = redact_url(urls[0])
        if len(urls) > 1:
            self.display_url += f" and {len(urls) - 1} more"
        self._display_endpoint = redact_url(urls[0]).rstrip("/")
        self._redact = Redactor(*urls)
        self._wires: dict[str, _Wire] = {}
        #: The endpoints, their load and health (``judge/farm.py``).
        self.farm = Farm(
            urls,
            max_in_flight=judge.in_flight_per_endpoint(),
            capacity=config.judge_max_concurrency,
            display=lambda u: redact_url(u).rstrip("/"),
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
        #: Output tokens spent, read by the metrics (``judge/budget.py``).
        self.tokens = TokenLedger()
        #: ``judge.adaptive_budget``: learns how long converging verdicts run.
        self.budget: AdaptiveBudget | None = None
        if judge.adaptive_budget:
            self.budget = AdaptiveBudget(
                cap=judge.max_output_tokens,
                quantile=judge.adaptive_budget_quantile,
                margin=judge.adaptive_budget_margin,
                floor=judge.adaptive_budget_floor,
                min_samples=judge.adaptive_budget_min_samples,
            )
        self._sleep = sleep
        self._clock = clock
        self._backoff = _Backoff(
            config.genrm_parse_retry_sleep_s, config.judge.max_retry_sleep_s, random
        )
        headers = {"Content-Type": "application/json"}
        self._api_key = config.judge.api_key()
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None

    def _wire(self, endpoint: Endpoint) -> _Wire:
        wire = self._wires.get(endpoint.url)
        if wire is None:
            url = endpoint.url
            headers = None
            _, user, password = split_userinfo(url)
            if not self._api_key and user is not None:
                token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
                headers = {"Authorization": f"Basic {token}"}
            wire = _Wire(judge_endpoint(url, self._config.judge.api), judge_base_url(url), headers)
            self._wires[url] = wire
        return wire

    def _unreachable(self, endpoint: Endpoint | None, detail: str) -> None:
        """Readiness hears "unreachable" once no endpoint of the farm answers."""
        if endpoint is not None:
            endpoint.reachable = False
        if not any(e.reachable and e.takes_work for e in self.farm.endpoints):
            self._reachability.judge_unreachable(detail)

    def _reached(self, endpoint: Endpoint | None) -> None:
        if endpoint is not None:
            endpoint.reachable = True
        self._reachability.judge_reachable()

    @property
    def config(self) -> JudgeView:
        return self._config

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._config.judge.max_connections,
                limit_per_host=0,
                # Deadlines are ours (asyncio.timeout per attempt), not aiohttp's.
                ttl_dns_cache=60,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                headers=self._headers,
                auto_decompress=True,
                raise_for_status=False,
            )
        return self._session

    # -- readiness probe ------------------------------------------------------------------

    async def probe(self, timeout_s: float) -> ProbeResult:
        """One cheap request (``GET /v1/models``) to every endpoint, bounded by ``timeout_s``.

        Reachable means some endpoint answered HTTP with anything but 502/503/504 (a 404
        from a server without ``/v1/models`` still shows it is up). Never raises.
        """
        endpoints = [e for e in self.farm.endpoints if e.state is not EndpointState.DRAINING]
        results = await asyncio.gather(*(self._probe_one(e, timeout_s) for e in endpoints))
        if not any(e.takes_work for e in endpoints):
            # Answering is not enough: ejected or not serving the model, none can judge.
            states = "; ".join(f"{e.display} {e.state}: {e.detail}" for e in endpoints)
            return ProbeResult(False, f"no judge endpoint is healthy: {states}")
        if len(results) == 1:
            return results[0]
        working = zip(endpoints, results, strict=True)
        reachable = any(r.reachable for e, r in working if e.takes_work)
        detail = "; ".join(
            f"{e.display}: {r.detail}" for e, r in zip(endpoints, results, strict=True)
        )
        return ProbeResult(reachable, detail)

    async def _probe_one(self, endpoint: Endpoint, timeout_s: float) -> ProbeResult:
        status, _ = await self.get(endpoint, "/v1/models", timeout_s)
        if isinstance(status, str):
            return ProbeResult(False, status)
        if status in _OUTAGE_STATUSES:
            return ProbeResult(False, f"HTTP {status}")
        return ProbeResult(True, f"HTTP {status}")

    async def get(
        self, endpoint: Endpoint, path: str, timeout_s: float, *, limit: int = _READ_CHUNK
    ) -> tuple[int | str, bytes]:
        """``GET`` a path of the endpoint: (status, first ``limit`` bytes), or (why, b"")."""
        wire = self._wire(endpoint)
        try:
            async with asyncio.timeout(timeout_s):
                async with self._http().get(wire.base_url + path, headers=wire.headers) as r:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in r.content.iter_chunked(_READ_CHUNK):
                        chunks.append(chunk)
                        size += len(chunk)
                        if size >= limit:
                            break
                    return r.status, b"".join(chunks)[:limit]
        except TimeoutError:
            return f"no answer within {timeout_s:g}s", b""
        except (aiohttp.ClientError, OSError) as exc:
            return self._redact(_describe(exc)), b""

    async def models(self, endpoint: Endpoint, timeout_s: float) -> ModelsAnswer:
        """What ``GET /v1/models`` of one endpoint says about ``judge.model``."""
        status, raw = await self.get(endpoint, "/v1/models", timeout_s, limit=_MODELS_BYTES)
        if isinstance(status, str):
            return ModelsAnswer("unreachable", (), status)
        if status == 404:
            return ModelsAnswer("unknown", (), "no /v1/models (HTTP 404)")
        if status != 200:
            return ModelsAnswer("unreachable", (), f"/v1/models: HTTP {status}")
        try:
            body = _decode_json(raw)
            names = tuple(str(m["id"]) for m in body["data"] if isinstance(m, dict) and "id" in m)
        except (ValueError, KeyError, TypeError):
            return ModelsAnswer("unknown", (), "/v1/models answered no model list")
        if self._config.judge.model in names:
            return ModelsAnswer("served", names, "serves the model")
        return ModelsAnswer("not_served", names, "serves " + (", ".join(names) or "no model"))

    async def check_models(self, timeout_s: float) -> ModelCheck:
        """Start-up: ask every endpoint; those that answer without the model are out."""
        endpoints = list(self.farm.endpoints)
        answers = await asyncio.gather(*(self.models(e, timeout_s) for e in endpoints))
        for endpoint, answer in zip(endpoints, answers, strict=True):
            if answer.state == "not_served":
                self.farm.wrong_model(endpoint, self.not_served(answer))
        return ModelCheck(self._config.judge.model, tuple(zip(endpoints, answers, strict=True)))

    def not_served(self, answer: ModelsAnswer) -> str:
        model = self._config.judge.model
        return f"does not serve judge.model {model!r} ({answer.detail})"

    async def health(self, endpoint: Endpoint, timeout_s: float) -> str | None:
        """Readmission probe: None when the endpoint is fit for work, else why not.

        ``GET /health`` first (vLLM answers it from its engine: a hung engine fails it
        while ``/v1/models`` still answers); 404 there means a server without it. Then
        ``/v1/models`` must list the model (or not exist).
        """
        status, _ = await self.get(endpoint, "/health", timeout_s)
        if isinstance(status, str):
            return f"/health: {status}"
        if status != 404 and not 200 <= status <= 299:
            return f"/health: HTTP {status}"
        answer = await self.models(endpoint, timeout_s)
        if answer.state == "unreachable":
            return answer.detail
        if answer.state == "not_served":
            return self.not_served(answer)
        return None

    # -- comparisons ----------------------------------------------------------------------

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        """Judge one ordered pair.

        With ``swap`` the judge sees ``response_2`` first; the verdict is mapped back to
        the caller's order (scores exchanged, ``ranking' = 7 - ranking``). Raises
        ``JudgeFailedError`` when the judge gave no usable answer.
        """
        cfg = self._config
        sent = replace(inp, response_1=inp.response_2, response_2=inp.response_1) if swap else inp
        payload = self._payload(sent)
        cap = cfg.judge.max_output_tokens
        bodies = {cap: _encode(payload)}
        tally = _Tally(progress=inp.progress)
        max_attempts = cfg.genrm_parse_retries + 1
        tried: list[Endpoint] = []  # endpoints an attempt failed on: retries go elsewhere

        verdict: Verdict | None = None
        started = time.perf_counter()
        outcome: ComparisonOutcome = "failed"
        if inp.progress is not None:
            inp.progress.in_flight += 1
        try:
            # A plain loop rather than a retry library: the first attempt usually
            # answers, and this path runs once per judge call (see docs/performance.md).
            while True:
                tally.limit = self._attempt_budget(tally, max_attempts)
                tally.adaptive = tally.limit != cap
                body = bodies.get(tally.limit)
                if body is None:
                    body = bodies[tally.limit] = _encode(self._with_budget(payload, tally.limit))
                try:
                    verdict = await self._attempt(body, tally, inp.affinity, tried)
                    break
                except _AttemptFailed as failure:
                    decision = after_failed_attempt(
                        _attempt_end(failure),
                        answered=tally.answered,
                        budget_left=tally.budget_spent < max_attempts,
                    )
                    if decision != "retry":
                        failure.decision = decision
                        raise
                    wait = self._backoff.wait(tally.attempts, failure)
                    self._log_retry(failure, tally, wait, max_attempts, swap)
                    await self._sleep(wait)
            outcome = "ok"
            self.tokens.verdict(tally.last_output)
            if self.budget is not None:
                self.budget.observe(tally.last_output)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except _AttemptFailed as last:
            if last.decision == "judge_failed":
                raise JudgeFailedError(self._exhausted_reason(last, tally)) from None
            outcome = "default_verdict"
            logger.warning(
                "judge gave no parseable verdict in %d attempts; using the default verdict",
                tally.attempts,
                extra={
                    "judge_url": self._display_endpoint,
                    "judge_api": cfg.judge.api,
                    "judge_attempts": tally.attempts,
                    "judge_failed_attempts": dict(tally.kinds),
                },
            )
            verdict = Verdict(
                cfg.default_score, cfg.default_score, cfg.default_ranking, parse_failed=True
            )
        finally:
            if inp.progress is not None:
                inp.progress.in_flight -= 1
            self._observer.judge_comparison(outcome, time.perf_counter() - started)
            self.tokens.wasted += tally.wasted_output
            self.tokens.adaptive_cuts += tally.adaptive_cuts
        return JudgeOutcome(
            verdict=verdict.swapped() if swap else verdict,
            usage=tally.usage(),
            attempts=tally.attempts,
            wasted_output_tokens=tally.wasted_output,
            adaptive_cuts=tally.adaptive_cuts,
        )

    def _attempt_budget(self, tally: _Tally, max_attempts: int) -> int | None:
        """The output budget of the next attempt: the adaptive one when it cuts, except
        for the last attempt of a comparison whose every attempt so far it cut (that
        one gets the configured cap, so the adaptive budget alone never masks)."""
        cap = self._config.judge.max_output_tokens
        budget = self.budget
        if budget is None or not budget.cuts():
            return cap
        last = tally.budget_spent >= max_attempts - 1
        if last and tally.attempts > 0 and tally.adaptive_cuts == tally.attempts:
            return cap
        return budget.current()

    def _with_budget(self, payload: dict[str, Any], limit: int | None) -> dict[str, Any]:
        key = "max_output_tokens" if self._config.judge.api == "responses" else "max_tokens"
        out = dict(payload)
        if limit is None:
            out.pop(key, None)
        else:
            out[key] = limit
        return out

    def _log_retry(
        self, failure: _AttemptFailed, tally: _Tally, wait: float, max_attempts: int, swap: bool
    ) -> None:
        kind = failure.kind
        self._observer.judge_retry(kind)
        logger.warning(
            "judge attempt %d failed (%s%s); retrying in %.3fs: %s",
            tally.attempts,
            kind,
            "" if failure.spent_budget else ", outage tolerance: budget not spent",
            wait,
            self._redact(_truncate(failure.log_detail, _EXCERPT_CHARS)),
            extra={
                "judge_url": self._display_endpoint,
                "judge_api": self._config.judge.api,
                "judge_attempt": tally.attempts,
                "judge_max_attempts": max_attempts,
                "judge_budget_spent": tally.budget_spent,
                "judge_failure_kind": kind,
                "judge_retry_in_s": wait,
                "judge_swapped": swap,
            },
        )

    def _payload(self, inp: JudgeInput) -> dict[str, Any]:
        cfg = self._config
        conversation = [{"role": role, "content": content} for role, content in inp.messages]
        body: dict[str, Any] = {"model": cfg.judge.model}
        if cfg.judge.api == "responses":
            metadata = {"response_1": inp.response_1, "response_2": inp.response_2}
            if inp.principle:
                metadata["principle"] = inp.principle
            body["input"] = conversation
            body["metadata"] = metadata
            if cfg.judge.max_output_tokens is not None:
                body["max_output_tokens"] = cfg.judge.max_output_tokens
        else:
            messages = list(conversation)
            if inp.principle:
                messages.append({"role": "principle", "content": inp.principle})
            messages.append({"role": "response_1", "content": inp.response_1})
            messages.append({"role": "response_2", "content": inp.response_2})
            body["messages"] = messages
            if cfg.judge.max_output_tokens is not None:
                body["max_tokens"] = cfg.judge.max_output_tokens
        if cfg.judge.temperature is not None:
            body["temperature"] = cfg.judge.temperature
        if cfg.judge.top_p is not None:
            body["top_p"] = cfg.judge.top_p
        if cfg.judge.stream:
            body["stream"] = True
            if cfg.judge.api == "chat_completions":
                body["stream_options"] = {"include_usage": True}
        return body

    async def _attempt(
        self, body: bytes, tally: _Tally, key: str | None, tried: list[Endpoint]
    ) -> Verdict:
        """One HTTP attempt: a verdict, or ``_AttemptFailed`` / ``JudgeFailedError``."""
        started = time.perf_counter()
        outcome = "error"  # an unexpected exception (a bug): still counted and timed
        tally.attempts += 1
        tally.last_output = 0
        try:
            verdict = await self._attempt_verdict(body, tally, key, tried)
            outcome = "ok"
        except _AttemptFailed as failure:
            outcome = failure.kind
            tally.kinds[failure.kind] += 1
            self._account(failure, tally)
            raise
        except JudgeFailedError as failure:
            outcome = failure.kind
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            seconds = time.perf_counter() - started
            self._observer.judge_request(outcome, seconds)
            if logger.isEnabledFor(logging.DEBUG):  # the extra dict costs even when off
                logger.debug(
                    "judge request %s in %.3fs",
                    outcome,
                    seconds,
                    extra={"judge_attempt": tally.attempts, "judge_outcome": outcome},
                )
        tally.outage_since = None
        tally.budget_spent += 1
        return verdict

    def _account(self, failure: _AttemptFailed, tally: _Tally) -> None:
        """Decide whether a failed attempt spends the budget (outage tolerance)."""
        tolerance = self._config.judge_outage_tolerance_s
        if failure.answered:
            tally.answered = True
        if failure.outage and tolerance > 0:
            now = self._clock()
            if tally.outage_since is None:
                tally.outage_since = now
            if now - tally.outage_since < tolerance:
                failure.spent_budget = False
                return
        else:
            tally.outage_since = None
        tally.budget_spent += 1

    async def _attempt_verdict(
        self, body: bytes, tally: _Tally, key: str | None, tried: list[Endpoint]
    ) -> Verdict:
        cfg = self._config
        attempt_no = tally.attempts
        primary = self.farm.try_acquire(key, tried) or await self.farm.acquire(key, tried)
        try:
            async with asyncio.timeout(cfg.judge_request_timeout_s):
                reply = await self._send(body, attempt_no, primary, key, tried, tally.progress)
        except TimeoutError:
            self.farm.failed(primary, "deadline", "request deadline expired")
            tried.append(primary)
            self._unreachable(primary, "request deadline expired")
            self._hung(
                "deadline",
                f"attempt {attempt_no}: no complete answer within "
                f"judge_request_timeout_s={cfg.judge_request_timeout_s:g}s",
                tally,
            )
        except _AttemptFailed as failure:
            if failure.endpoint is not None:
                tried.append(failure.endpoint)
            if failure.kind == "first_token":
                self._hung(failure.kind, failure.detail, tally)
            raise
        finally:
            self.farm.release(primary)

        status = reply.status
        if 500 <= status <= 599:
            tried.append(reply.endpoint or primary)
        if status in _OUTAGE_STATUSES:
            self._unreachable(reply.endpoint, f"HTTP {status}")
        else:
            self._reached(reply.endpoint)
        if status in _RETRYABLE_STATUSES or 500 <= status <= 599:
            raise _AttemptFailed(
                f"http_{status}",
                f"attempt {attempt_no}: HTTP {status}",
                retry_after=parse_retry_after(reply.retry_after),
                outage=status in _OUTAGE_STATUSES,
                log_detail=f"attempt {attempt_no}: HTTP {status}: {_excerpt_bytes(reply.body)}",
            )
        if not 200 <= status <= 299:
            logger.warning(
                "judge returned HTTP %d (not retried): %s",
                status,
                self._redact(_excerpt_bytes(reply.body)),
                extra={"judge_url": self._display_endpoint, "judge_attempt": attempt_no},
            )
            raise JudgeFailedError(
                f"judge returned HTTP {status} on attempt {attempt_no}; "
                "not retried (only 408, 429 and 5xx are)",
                kind=f"http_{status}",
            )

        if reply.streamed is not None:
            if reply.streamed_bytes >= self._offload_bytes:
                answer = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._interpret, reply.streamed, attempt_no
                )
            else:
                answer = self._interpret(reply.streamed, attempt_no)
        elif len(reply.body) >= self._offload_bytes:
            # Decoding a large body and scanning a large answer are CPU work: keep them
            # off the event loop so health checks and other cohorts keep being served.
            answer = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._decode, reply.body, attempt_no
            )
        else:
            answer = self._decode(reply.body, attempt_no)
        tally.last_output = answer.usage.output_tokens if answer.usage is not None else 0
        if answer.usage is not None:
            tally.add_usage(answer.usage)
            if reply.endpoint is not None:
                reply.endpoint.input_tokens += answer.usage.input_tokens
                reply.endpoint.output_tokens += answer.usage.output_tokens
                reply.endpoint.cached_tokens += answer.usage.cached_tokens

        if answer.verdict is None:
            tally.wasted_output += tally.last_output
        if answer.state == "budget_exhausted":
            tally.budget_exhausted += 1
            used = f"max_output_tokens={_budget_label(tally.limit)}"
            if tally.adaptive:
                tally.adaptive_cuts += 1
                used += (
                    f", the adaptive budget; configured cap "
                    f"{_budget_label(cfg.judge.max_output_tokens)}"
                )
            raise _AttemptFailed(
                "incomplete_max_output_tokens",
                f"attempt {attempt_no}: answer incomplete, the judge ran out of output "
                f"tokens ({used})",
            )
        if answer.state != "completed":
            raise _AttemptFailed(
                "incomplete", f"attempt {attempt_no}: answer not completed ({answer.state})"
            )
        if not answer.text.strip():
            raise _AttemptFailed("empty_answer", f"attempt {attempt_no}: completed answer is empty")
        if answer.verdict is None:
            raise _AttemptFailed(
                "unparseable",
                f"attempt {attempt_no}: answer has no valid verdict JSON",
                answered=True,
                log_detail=(
                    f"attempt {attempt_no}: answer has no valid verdict JSON: "
                    f"{_excerpt(answer.text)}"
                ),
            )
        return answer.verdict

    def _hung(self, kind: str, detail: str, tally: _Tally) -> None:
        """A request that got no answer in time (its deadline, or no first token).

        In a farm of two or more another endpoint may answer: the attempt fails, spends
        the budget and the retry goes elsewhere. With one endpoint, Gym's rule: final,
        unless ``judge_outage_tolerance_s`` still covers it. Raises either way."""
        cfg = self._config
        if self.farm.size >= 2:
            raise _AttemptFailed(kind, detail) from None
        if cfg.judge_outage_tolerance_s > 0:
            now = self._clock()
            since = tally.outage_since if tally.outage_since is not None else now
            if now - since < cfg.judge_outage_tolerance_s:
                raise _AttemptFailed(kind, detail, outage=True) from None
        if kind == "first_token":
            raise JudgeFailedError(self._first_token_reason(tally), kind=kind) from None
        raise JudgeFailedError(self._deadline_reason(tally), kind=kind) from None

    def _decode(self, raw: bytes, attempt_no: int) -> _Answer:
        """JSON-decode a 2xx body, extract the answer and parse its verdict (pure CPU)."""
        try:
            body = _decode_json(raw)
        except ValueError:
            raise _AttemptFailed(
                "invalid_body",
                f"attempt {attempt_no}: HTTP 2xx body is not JSON",
                log_detail=f"attempt {attempt_no}: body is not JSON: {_excerpt_bytes(raw)}",
            ) from None
        return self._interpret(body, attempt_no)

    def _interpret(self, body: Any, attempt_no: int) -> _Answer:
        """Extract the answer of a decoded (or reassembled streamed) 2xx body and parse
        its verdict (pure CPU)."""
        cfg = self._config
        if not isinstance(body, dict):
            raise _AttemptFailed(
                "invalid_body", f"attempt {attempt_no}: HTTP 2xx body is not a JSON object"
            )
        usage = _read_usage(body, cfg.judge.api)
        try:
            text, state = _read_answer(body, cfg.judge.api)
        except ValueError as exc:
            raise _AttemptFailed(
                "invalid_body", f"attempt {attempt_no}: unexpected answer shape: {exc}"
            ) from None
        verdict = None
        if state == "completed" and text.strip():
            verdict = parse_verdict(
                text, default_score=cfg.default_score, default_ranking=cfg.default_ranking
            )
        return _Answer(text, state, verdict, usage)

    async def _send(
        self,
        body: bytes,
        attempt_no: int,
        primary: Endpoint,
        key: str | None,
        tried: list[Endpoint],
        progress: JudgeProgress | None = None,
    ) -> _Reply:
        """POST once to ``primary``; hedged on another endpoint after its hedge point.

        The hedge point is ``judge_hedge_after_s`` or, in a farm, a high quantile of the
        endpoint's latencies (``Farm.hedge_after``). A request that the hedge beats
        counts against its endpoint's health ("slow"): a node that accepts and never
        answers is ejected after a few of them.
        """
        hedge_after = self.farm.hedge_after(primary)
        if hedge_after is None:
            return await self._post(body, attempt_no, primary, progress)
        first: asyncio.Future[_Reply] = asyncio.ensure_future(
            self._post(body, attempt_no, primary, progress)
        )
        tasks = [first]
        extra: Endpoint | None = None
        try:
            done, _ = await asyncio.wait(tasks, timeout=hedge_after)
            if done:
                return first.result()
            extra = self.farm.pick(key, [primary, *tried])
            if extra is not None:
                self.farm.take(extra)
            else:
                # Every other endpoint is full: the hedge takes the first slot that
                # frees (a farm at saturation must still get a hung request answered).
                room = asyncio.ensure_future(self.farm.acquire(key, [primary, *tried]))
                racing: list[asyncio.Future[Any]] = [first, room]
                await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
                if first.done():
                    room.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        got = await room
                        self.farm.release(got)  # acquired as it was cancelled
                    return first.result()
                extra = room.result()
            extra.hedges += 1
            self._on_hedge()
            logger.debug(
                "judge attempt %d hedged after %.3gs on %s",
                attempt_no,
                hedge_after,
                extra.display,
            )
            second = asyncio.ensure_future(self._post(body, attempt_no, extra, progress))
            tasks.append(second)
            pending: set[asyncio.Future[_Reply]] = set(tasks)
            failure: BaseException | None = None
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    error = task.exception()
                    if error is None:
                        if task is second and extra is not primary and not first.done():
                            self.farm.failed(
                                primary,
                                "slow",
                                f"no answer within the hedge point {hedge_after:.3g}s",
                            )
                        return task.result()
                    failure = error
            assert failure is not None
            raise failure
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if extra is not None:
                self.farm.release(extra)

    async def _post(
        self,
        body: bytes,
        attempt_no: int,
        endpoint: Endpoint,
        progress: JudgeProgress | None = None,
    ) -> _Reply:
        """One HTTP request; the whole body is read, up to ``max_response_bytes``.

        What happened is reported to the farm: a 2xx answer's latency, a 5xx or a
        transport failure against the endpoint's health. With ``judge.stream``, no
        first generated token within ``judge.first_token_timeout_s`` (counted from the
        send, connection retries included) closes the connection and counts against
        the endpoint like a request timeout (kind ``first_token``).
        """
        wire = self._wire(endpoint)
        judge = self._config.judge
        first_token_s = judge.first_token_timeout_s if judge.stream else None
        connects = 0
        started = time.perf_counter()
        first_token = asyncio.timeout(first_token_s)
        try:
            async with first_token:
                while True:
                    try:
                        async with self._http().post(
                            wire.post_url, data=body, headers=wire.headers
                        ) as response:
                            reply = await self._read(
                                response, attempt_no, endpoint, progress, first_token
                            )
                        break
                    except aiohttp.ClientConnectorError as exc:
                        if connects < self._connect_retries:
                            connects += 1
                            continue
                        self._transport_failed(endpoint, exc)
                        failure = self._transport_failure(exc, attempt_no, "cannot connect")
                        failure.endpoint = endpoint
                        raise failure from None
                    except (aiohttp.ClientError, OSError) as exc:
                        self._transport_failed(endpoint, exc)
                        failure = self._transport_failure(
                            exc, attempt_no, "connection lost before the answer was complete"
                        )
                        failure.endpoint = endpoint
                        raise failure from None
                    except _AttemptFailed as failure:  # oversized: the node answered
                        self.farm.answered(endpoint)
                        failure.endpoint = endpoint
                        raise
        except TimeoutError:
            # Only the first-token timer ends here (the loop above turns every other
            # OSError into a transport failure); the connection is already closed.
            assert first_token_s is not None
            detail = f"no first token within judge.first_token_timeout_s={first_token_s:g}s"
            self.farm.failed(endpoint, "first_token", detail)
            self._unreachable(endpoint, detail)
            self.tokens.first_token_timeouts += 1
            hung = _AttemptFailed("first_token", f"attempt {attempt_no}: {detail}")
            hung.endpoint = endpoint
            raise hung from None
        status = reply.status
        if 200 <= status <= 299:
            self.farm.succeeded(endpoint, time.perf_counter() - started)
        elif 500 <= status <= 599:
            self.farm.failed(endpoint, "http_5xx", f"HTTP {status}")
        elif status not in _RETRYABLE_STATUSES:
            self.farm.answered(endpoint)
        return reply

    def _transport_failed(self, endpoint: Endpoint, exc: BaseException) -> None:
        detail = self._redact(_describe(exc))
        self.farm.failed(endpoint, "transport", _failure_class(exc))
        self._unreachable(endpoint, detail)

    async def _read(
        self,
        response: aiohttp.ClientResponse,
        attempt_no: int,
        endpoint: Endpoint,
        progress: JudgeProgress | None = None,
        first_token: asyncio.Timeout | None = None,
    ) -> _Reply:
        retry_after = response.headers.get("Retry-After")
        if (
            self._config.judge.stream
            and 200 <= response.status <= 299
            and response.content_type == "text/event-stream"
        ):
            streamed, size = await self._read_stream(response, attempt_no, progress, first_token)
            return _Reply(response.status, b"", retry_after, endpoint, streamed, size)
        if first_token is not None:
            # Not a stream (an error, or a server that ignores "stream"): the whole
            # answer is here already or comes as one body; the request deadline holds.
            first_token.reschedule(None)
        cap = self._config.judge.max_response_bytes
        declared = response.content_length
        if declared is not None:
            if declared > cap:
                response.close()  # drop the connection rather than drain an oversized body
                raise self._oversized(attempt_no, declared)
            # The body is exactly Content-Length bytes: one read, no chunk loop.
            body = await response.read()
            return _Reply(response.status, body, retry_after, endpoint)
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > cap:
                response.close()
                raise self._oversized(attempt_no, size)
            chunks.append(chunk)
        return _Reply(response.status, b"".join(chunks), retry_after, endpoint)

    async def _read_stream(
        self,
        response: aiohttp.ClientResponse,
        attempt_no: int,
        progress: JudgeProgress | None,
        first_token: asyncio.Timeout | None,
    ) -> tuple[Any, int]:
        """Read a server-sent-events answer; (the reassembled body, its text bytes).

        Every event that carries generated text counts one token towards ``progress``
        and the ledger's in-flight gauge while the request runs. Anything but a
        complete stream (an error, a cancellation: a hedge won, the cohort ended, the
        deadline) closes the connection, which makes vLLM abort the generation."""
        stream = SSEAnswer(self._config.judge.api, self._config.judge.max_response_bytes)
        ledger = self.tokens
        counted = 0
        complete = False
        loop = asyncio.get_running_loop()
        try:
            async for chunk in response.content.iter_any():
                if stream.pending_bytes + len(chunk) >= self._offload_bytes:
                    # A large event (a long answer in one piece) is decoded off the loop.
                    new = await loop.run_in_executor(self._executor, stream.feed, chunk)
                else:
                    new = stream.feed(chunk)
                if new:
                    if counted == 0 and first_token is not None:
                        first_token.reschedule(None)
                    counted += new
                    ledger.streamed_in_flight += new
                    if progress is not None:
                        progress.tokens += new
            # Read to the end even after the last event: the connection then stays
            # in the keep-alive pool (a server ends the body right after that event).
            if not stream.done:
                # As an interrupted non-streamed body: the connection is lost.
                raise aiohttp.ClientPayloadError("the stream ended before its last event")
            body = stream.body()
            complete = True
        except StreamTooLarge as exc:
            raise self._oversized(attempt_no, exc.size) from None
        except StreamError as exc:
            raise _AttemptFailed(
                "invalid_body",
                f"attempt {attempt_no}: unreadable answer stream: {exc}",
            ) from None
        finally:
            ledger.streamed_in_flight -= counted
            if progress is not None:
                progress.tokens -= counted
            if not complete:
                response.close()
        return body, stream.text_bytes

    def _oversized(self, attempt_no: int, size: int) -> _AttemptFailed:
        return _AttemptFailed(
            "oversized",
            f"attempt {attempt_no}: response body over judge.max_response_bytes="
            f"{self._config.judge.max_response_bytes} ({size} bytes or more)",
            answered=True,
        )

    def _transport_failure(self, exc: BaseException, attempt_no: int, what: str) -> _AttemptFailed:
        return _AttemptFailed(
            "transport",
            f"attempt {attempt_no}: {what} ({_failure_class(exc)})",
            outage=True,
            log_detail=f"attempt {attempt_no}: {what}: {self._redact(_describe(exc))}",
        )

    def _deadline_reason(self, tally: _Tally) -> str:
        cfg = self._config
        # NeMo Gym's shared aiohttp client runs without a total timeout, so a hung judge
        # there waits forever; here the deadline is final because it already covered
        # the connection retries and a fresh attempt would just wait as long again.
        reason = (
            "judge request deadline expired: no complete answer within "
            f"judge_request_timeout_s={cfg.judge_request_timeout_s:g}s on attempt "
            f"{tally.attempts} of {cfg.genrm_parse_retries + 1}; the deadline is not retried"
        )
        if cfg.judge_outage_tolerance_s > 0:
            reason += (
                f" beyond judge_outage_tolerance_s={cfg.judge_outage_tolerance_s:g}s of outage"
            )
        return reason + self._budget_advice(tally) + self._outcome_summary(tally)

    def _first_token_reason(self, tally: _Tally) -> str:
        cfg = self._config
        reason = (
            "judge sent no first token within judge.first_token_timeout_s="
            f"{cfg.judge.first_token_timeout_s:g}s on attempt {tally.attempts} of "
            f"{cfg.genrm_parse_retries + 1}; with one endpoint a hung request is not "
            "retried (as judge_request_timeout_s)"
        )
        if cfg.judge_outage_tolerance_s > 0:
            reason += (
                f" beyond judge_outage_tolerance_s={cfg.judge_outage_tolerance_s:g}s of outage"
            )
        return reason + self._budget_advice(tally) + self._outcome_summary(tally)

    def _exhausted_reason(self, last: _AttemptFailed, tally: _Tally) -> str:
        cfg = self._config
        reason = (
            f"judge gave no usable verdict after {tally.attempts} attempt(s) "
            f"(genrm_parse_retries={cfg.genrm_parse_retries})"
        )
        return (
            reason
            + self._budget_advice(tally)
            + self._outcome_summary(tally)
            + f"; last attempt: {last.detail}"
        )

    def _budget_advice(self, tally: _Tally) -> str:
        if not tally.budget_exhausted:
            return ""
        budget = _budget_label(self._config.judge.max_output_tokens)
        return (
            f"; {tally.budget_exhausted} of {tally.attempts} attempt(s) ended incomplete "
            f"because the judge used up its output budget (max_output_tokens={budget}): "
            "raise the judge output budget or constrain the judge's reasoning "
            "(e.g. a lower reasoning effort or a thinking-token budget)"
        )

    @staticmethod
    def _outcome_summary(tally: _Tally) -> str:
        if not tally.kinds:
            return ""
        parts = ", ".join(f"{kind}×{count}" for kind, count in sorted(tally.kinds.items()))
        return f"; failed attempts: {parts}"


def _encode(payload: dict[str, Any]) -> bytes:
    """A request body as JSON bytes: orjson (about 30× faster than ``json.dumps`` on two
    2 KiB answers, docs/performance.md); it writes UTF-8 where ``json`` writes ``\\u``
    escapes, the same JSON. Text orjson refuses (a lone surrogate) goes through ``json``.
    The only numbers sent are settings that ``genrm_grpc.config`` keeps finite (orjson
    would write a NaN as ``null``)."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload).encode("utf-8")


def _decode_json(raw: bytes) -> Any:
    """A response body decoded as ``json.loads`` decodes it, with orjson's speed.

    orjson refuses a few bodies that ``json.loads`` reads (``NaN``, ``Infinity``,
    escaped lone surrogates, nesting deeper than 1024); those go through ``json.loads``,
    so which bodies decode is what it was with ``json`` alone. One value differs:
    orjson reads an integer beyond 64 bits as a float; the only integers the client
    reads are token counts, and ``_count`` leaves those uncounted from either decoder.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _read_answer(body: dict[str, Any], api: JudgeApi) -> tuple[str, str]:
    """The answer text and its state: ``completed``, ``budget_exhausted`` or other."""
    if api == "responses":
        output = body.get("output")
        if output is None:
            output = []
        if not isinstance(output, list):
            raise ValueError("'output' is not a list")
        text = "".join(
            part["text"]
            for item in output
            if isinstance(item, dict) and item.get("type") == "message"
            for part in (item.get("content") or [])
            if isinstance(part, dict)
            and part.get("type") == "output_text"
            and isinstance(part.get("text"), str)
        )
        status = body.get("status")
        if status is None or status == "completed":
            return text, "completed"
        if status == "incomplete":
            details = body.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            if reason == "max_output_tokens":
                return text, "budget_exhausted"
            return text, f"status 'incomplete', reason {reason!r}"
        return text, f"status {status!r}"

    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("'choices' is missing or empty")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ValueError("'choices[0].message' is missing")
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    else:
        raise ValueError("'choices[0].message.content' is neither text nor parts")
    if choice.get("finish_reason") == "length":
        return text, "budget_exhausted"
    return text, "completed"


def _read_usage(body: dict[str, Any], api: JudgeApi) -> TokenUsage | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    if api == "responses":
        input_key, output_key, details_key, cached_key = (
            "input_tokens",
            "output_tokens",
            "output_tokens_details",
            "input_tokens_details",
        )
    else:
        input_key, output_key, details_key, cached_key = (
            "prompt_tokens",
            "completion_tokens",
            "completion_tokens_details",
            "prompt_tokens_details",
        )
    input_tokens = _count(usage.get(input_key))
    output_tokens = _count(usage.get(output_key))
    if input_tokens is None and output_tokens is None:
        return None
    details = usage.get(details_key)
    reasoning = _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    prompt_details = usage.get(cached_key)
    cached = (
        _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
    )
    return TokenUsage(input_tokens or 0, output_tokens or 0, reasoning or 0, cached or 0)


#: Token counts from 2**64 on are not counts a judge can report; orjson also reads such
#: integers as floats (``json`` as ints), so both decoders leave them uncounted.
_MAX_COUNT = 2**64 - 1


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        return None
    return value


def _describe(exc: BaseException) -> str:
    """``Type: message``, borrowing the message of an underlying cause when blank."""
    name = type(exc).__name__
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < 5:
        if str(cause):
            suffix = "" if cause is exc else f" ({type(cause).__name__})"
            return f"{name}: {cause}{suffix}"
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return name


def _budget_label(max_output_tokens: int | None) -> str:
    return "unset" if max_output_tokens is None else str(max_output_tokens)


def _excerpt(text: str) -> str:
    return _truncate(" ".join(text.split()), _EXCERPT_CHARS) or "<empty>"


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def _failure_class(exc: BaseException) -> str:
    """The exception class and, for OS errors, the errno text: no addresses, no URLs."""
    name = type(exc).__name__
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 5:
        errno = getattr(cause, "errno", None)
        if isinstance(errno, int) and errno > 0:
            return f"{name}: {os.strerror(errno)}"
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return name


def _excerpt_bytes(raw: bytes) -> str:
    return _excerpt(raw[: 4 * _EXCERPT_CHARS].decode("utf-8", errors="replace"))
