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

This module holds the retry logic; the rest of the client lives beside it:
``judge/views.py`` (the settings it reads), ``judge/types.py`` (what it takes, returns
and raises; both re-exported here), ``judge/wire.py`` (request bodies and answer
reading), ``judge/transport.py`` (the HTTP requests and hedging), ``judge/attempts.py``
(the book-keeping of one comparison's attempts), ``judge/texts.py`` (failure reasons)
and ``judge/checks.py`` (the readiness and model checks ``JudgeClient`` inherits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random as _random
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

from genrm_grpc.judge.attempts import (
    OUTAGE_STATUSES,
    RETRYABLE_STATUSES,
    AttemptFailed,
    Backoff,
    Tally,
    attempt_end,
    hung,
    parse_retry_after,
)
from genrm_grpc.judge.budget import AdaptiveBudget, TokenLedger, adaptive_budget
from genrm_grpc.judge.checks import EndpointChecks
from genrm_grpc.judge.farm import Endpoint, farm_for
from genrm_grpc.judge.redact import Redactor, redact_url
from genrm_grpc.judge.texts import (
    EXCERPT_CHARS,
    excerpt_bytes,
    exhausted_reason,
    truncate,
)
from genrm_grpc.judge.transport import Reply, Transport
from genrm_grpc.judge.types import (
    MAX_REASON_CHARS,
    JudgeFailedError,
    JudgeInput,
    JudgeOutcome,
    JudgeProgress,
    ModelCheck,
    ModelsAnswer,
    ProbeResult,
    ReachabilityListener,
    TokenUsage,
)
from genrm_grpc.judge.views import JudgeApi, JudgeBlockView, JudgeView
from genrm_grpc.judge.wire import (
    Answer,
    build_payload,
    count_usage,
    decode_answer,
    encode,
    interpret_answer,
    judge_base_url,
    judge_endpoint,
    verdict_of,
    with_budget,
)
from genrm_grpc.observability.hooks import ComparisonOutcome, JudgeObserver, NullJudgeObserver
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.scoring.verdict import after_failed_attempt

__all__ = [
    "MAX_REASON_CHARS",
    "OFFLOAD_BYTES",
    "JudgeApi",
    "JudgeBlockView",
    "JudgeClient",
    "JudgeFailedError",
    "JudgeInput",
    "JudgeOutcome",
    "JudgeProgress",
    "JudgeView",
    "ModelCheck",
    "ModelsAnswer",
    "ProbeResult",
    "ReachabilityListener",
    "TokenUsage",
    "judge_base_url",
    "judge_endpoint",
    "parse_retry_after",
]

logger = logging.getLogger(__name__)
#: Backoff jitter from a generator of its own, not the ``random`` module's shared one:
#: a process that seeds ``random`` for a reproducible run draws the same numbers
#: whether or not the judge was retried.
_JITTER = _random.Random()

OFFLOAD_BYTES = 64 * 1024
"""Bodies at least this large are decoded and parsed in a worker thread, not on the loop."""

_MODELS_BYTES = 1024 * 1024


class JudgeClient(EndpointChecks):
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
        random: Callable[[], float] = _JITTER.random,
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
        self._offload_bytes = offload_bytes
        self._executor = executor
        self._observer: JudgeObserver = observer or NullJudgeObserver()
        urls = config.judge.endpoint_urls()
        #: The configured endpoints as they may be logged: user-info replaced by ``***``.
        self.display_url = redact_url(urls[0])
        if len(urls) > 1:
            self.display_url += f" and {len(urls) - 1} more"
        self._display_endpoint = redact_url(urls[0]).rstrip("/")
        self._redact = Redactor(*urls)
        #: The endpoints, their load and health (``judge/farm.py``).
        self.farm = farm_for(config, lambda u: redact_url(u).rstrip("/"), clock)
        #: Output tokens spent, read by the metrics (``judge/budget.py``).
        self.tokens = TokenLedger()
        #: ``judge.adaptive_budget``: learns how long converging verdicts run.
        self.budget: AdaptiveBudget | None = adaptive_budget(config.judge)
        self._sleep = sleep
        self._clock = clock
        self._backoff = Backoff(
            config.genrm_parse_retry_sleep_s, config.judge.max_retry_sleep_s, random
        )
        self._transport = Transport(
            config,
            self.farm,
            self.tokens,
            self._redact,
            reachability=reachability or ReachabilityListener(),
            on_hedge=on_hedge or (lambda: None),
            connect_retries=connect_retries,
            offload_bytes=offload_bytes,
            executor=executor,
        )

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
        await self._transport.aclose()

    # -- comparisons ----------------------------------------------------------------------

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        """Judge one ordered pair.

        With ``swap`` the judge sees ``response_2`` first; the verdict is mapped back to
        the caller's order (scores exchanged, ``ranking' = 7 - ranking``). Raises
        ``JudgeFailedError`` when the judge gave no usable answer.
        """
        sent = replace(inp, response_1=inp.response_2, response_2=inp.response_1) if swap else inp
        payload = build_payload(self._config.judge, sent)
        bodies = {self._config.judge.max_output_tokens: encode(payload)}
        tally = Tally(progress=inp.progress)
        started = time.perf_counter()
        outcome: ComparisonOutcome = "failed"
        if inp.progress is not None:
            inp.progress.in_flight += 1
        try:
            verdict = await self._retrying(payload, bodies, tally, inp.affinity, swap)
            outcome = "ok"
            self.tokens.verdict(tally.last_output)
            if self.budget is not None:
                self.budget.observe(tally.last_output)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except AttemptFailed as last:
            if last.decision == "judge_failed":
                raise JudgeFailedError(exhausted_reason(self._config, last, tally)) from None
            outcome = "default_verdict"
            verdict = self._default_verdict(tally)
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

    async def _retrying(
        self,
        payload: dict[str, Any],
        bodies: dict[int | None, bytes],
        tally: Tally,
        key: str | None,
        swap: bool,
    ) -> Verdict:
        """Attempts until one gives a verdict; raises the ``AttemptFailed`` that ended
        the comparison (its ``decision`` set) or ``JudgeFailedError``."""
        cfg = self._config
        cap = cfg.judge.max_output_tokens
        max_attempts = cfg.genrm_parse_retries + 1
        tried: list[Endpoint] = []  # endpoints an attempt failed on: retries go elsewhere
        # A plain loop rather than a retry library: the first attempt usually
        # answers, and this path runs once per judge call (see docs/performance.md).
        while True:
            tally.limit = tally.next_limit(self.budget, cap, max_attempts)
            tally.adaptive = tally.limit != cap
            body = bodies.get(tally.limit)
            if body is None:
                limited = with_budget(cfg.judge.api, payload, tally.limit)
                body = bodies[tally.limit] = encode(limited)
            try:
                return await self._attempt(body, tally, key, tried)
            except AttemptFailed as failure:
                decision = after_failed_attempt(
                    attempt_end(failure),
                    answered=tally.answered,
                    budget_left=tally.budget_spent < max_attempts,
                )
                if decision != "retry":
                    failure.decision = decision
                    raise
                wait = self._backoff.wait(tally.attempts, failure)
                self._log_retry(failure, tally, wait, max_attempts, swap)
                await self._sleep(wait)

    def _default_verdict(self, tally: Tally) -> Verdict:
        """The neutral verdict of a comparison whose answers never parsed (GenRM's rule)."""
        cfg = self._config
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
        return Verdict(cfg.default_score, cfg.default_score, cfg.default_ranking, parse_failed=True)

    def _log_retry(
        self, failure: AttemptFailed, tally: Tally, wait: float, max_attempts: int, swap: bool
    ) -> None:
        kind = failure.kind
        self._observer.judge_retry(kind)
        logger.warning(
            "judge attempt %d failed (%s%s); retrying in %.3fs: %s",
            tally.attempts,
            kind,
            "" if failure.spent_budget else ", outage tolerance: budget not spent",
            wait,
            self._redact(truncate(failure.log_detail, EXCERPT_CHARS)),
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

    async def _attempt(
        self, body: bytes, tally: Tally, key: str | None, tried: list[Endpoint]
    ) -> Verdict:
        """One HTTP attempt: a verdict, or ``AttemptFailed`` / ``JudgeFailedError``."""
        started = time.perf_counter()
        outcome = "error"  # an unexpected exception (a bug): still counted and timed
        tally.attempts += 1
        tally.last_output = 0
        try:
            verdict = await self._attempt_verdict(body, tally, key, tried)
            outcome = "ok"
        except AttemptFailed as failure:
            outcome = failure.kind
            tally.kinds[failure.kind] += 1
            tally.spend(failure, self._config.judge_outage_tolerance_s, self._clock)
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

    async def _attempt_verdict(
        self, body: bytes, tally: Tally, key: str | None, tried: list[Endpoint]
    ) -> Verdict:
        reply, primary = await self._exchange(body, tally, key, tried)
        self._check_status(reply, primary, tally.attempts, tried)
        answer = await self._answer(reply, tally.attempts)
        count_usage(answer, reply.endpoint, tally)
        return verdict_of(answer, tally, self._config.judge.max_output_tokens)

    async def _exchange(
        self, body: bytes, tally: Tally, key: str | None, tried: list[Endpoint]
    ) -> tuple[Reply, Endpoint]:
        """Send the attempt within ``judge_request_timeout_s``: the reply, and the
        endpoint it was first sent to (``hung`` raises when no answer came in time)."""
        cfg = self._config
        attempt_no = tally.attempts
        farm = self.farm
        primary = farm.try_acquire(key, tried) or await farm.acquire(key, tried)
        try:
            async with asyncio.timeout(cfg.judge_request_timeout_s):
                reply = await self._transport.send(
                    body, attempt_no, primary, key, tried, tally.progress
                )
        except TimeoutError:
            farm.failed(primary, "deadline", "request deadline expired")
            tried.append(primary)
            self._transport.unreachable(primary, "request deadline expired")
            hung(
                cfg,
                farm.size,
                self._clock,
                "deadline",
                f"attempt {attempt_no}: no complete answer within "
                f"judge_request_timeout_s={cfg.judge_request_timeout_s:g}s",
                tally,
            )
        except AttemptFailed as failure:
            if failure.endpoint is not None:
                tried.append(failure.endpoint)
            if failure.kind == "first_token":
                hung(cfg, farm.size, self._clock, failure.kind, failure.detail, tally)
            raise
        finally:
            farm.release(primary)
        return reply, primary

    def _check_status(
        self, reply: Reply, primary: Endpoint, attempt_no: int, tried: list[Endpoint]
    ) -> None:
        """Raise unless the reply is 2xx: retryably for 408, 429 and 5xx, else finally."""
        status = reply.status
        if 500 <= status <= 599:
            tried.append(reply.endpoint or primary)
        if status in OUTAGE_STATUSES:
            self._transport.unreachable(reply.endpoint, f"HTTP {status}")
        else:
            self._transport.reached(reply.endpoint)
        if status in RETRYABLE_STATUSES or 500 <= status <= 599:
            raise AttemptFailed(
                f"http_{status}",
                f"attempt {attempt_no}: HTTP {status}",
                retry_after=parse_retry_after(reply.retry_after),
                outage=status in OUTAGE_STATUSES,
                log_detail=f"attempt {attempt_no}: HTTP {status}: {excerpt_bytes(reply.body)}",
            )
        if not 200 <= status <= 299:
            logger.warning(
                "judge returned HTTP %d (not retried): %s",
                status,
                self._redact(excerpt_bytes(reply.body)),
                extra={"judge_url": self._display_endpoint, "judge_attempt": attempt_no},
            )
            raise JudgeFailedError(
                f"judge returned HTTP {status} on attempt {attempt_no}; "
                "not retried (only 408, 429 and 5xx are)",
                kind=f"http_{status}",
            )

    async def _answer(self, reply: Reply, attempt_no: int) -> Answer:
        """The 2xx reply decoded; a large one off the event loop (``offload_bytes``)."""
        cfg = self._config
        if reply.streamed is not None:
            if reply.streamed_bytes >= self._offload_bytes:
                return await asyncio.get_running_loop().run_in_executor(
                    self._executor, interpret_answer, cfg, reply.streamed, attempt_no
                )
            return interpret_answer(cfg, reply.streamed, attempt_no)
        if len(reply.body) >= self._offload_bytes:
            # Decoding a large body and scanning a large answer are CPU work: keep them
            # off the event loop so health checks and other cohorts keep being served.
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, decode_answer, cfg, reply.body, attempt_no
            )
        return decode_answer(cfg, reply.body, attempt_no)
