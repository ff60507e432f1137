"""The judge client: one pairwise comparison against an OpenAI-compatible GenRM server.

A comparison is one logical call, ``JudgeClient.judge``, that may cost several HTTP
attempts. Every attempt draws on one shared budget (``genrm_parse_retries`` retries, so
``parse_retries + 1`` attempts): malformed, empty or budget-exhausted answers, HTTP
408/429/5xx, connection failures, interrupted bodies and invalid JSON bodies all spend it.
Other HTTP errors (400, 401, 404, ...) and an expired per-request deadline fail at once.

When the budget is spent the outcome depends on the *last* attempt only:

* it produced a completed, non-empty answer that does not parse into a verdict →
  the neutral default verdict, flagged ``parse_failed`` (GenRM convention);
* anything else (no completed answer: transport or HTTP failures, incomplete answers,
  an empty answer) → ``JudgeFailedError``. The caller masks the group instead of
  inventing a reward. NeMo Gym's genrm_compare differs here on purpose: it turns every
  exception into the default verdict, which silently fabricates rewards.

Two wire formats are spoken (PROTOCOL.md, "Judging"): ``responses``
(NeMo Gym's GenRM model server, answers in ``metadata``) and ``chat_completions``
(vLLM serving the GenRM chat template, answers as ``response_1``/``response_2`` roles).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import random as _random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC
from types import TracebackType
from typing import Any, Literal, Self

import httpx
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt
from tenacity.retry import retry_base
from tenacity.wait import wait_base

from genrm_grpc.observability.hooks import ComparisonOutcome, JudgeObserver, NullJudgeObserver
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.scoring.verdict import parse_verdict

logger = logging.getLogger(__name__)

JudgeApi = Literal["responses", "chat_completions"]

MAX_REASON_CHARS = 2000
"""Failure reasons travel to collectors in ``failure_reason``; the protocol caps them."""

_EXCERPT_CHARS = 300
_RETRYABLE_STATUSES = frozenset({408, 429})
# Exponent cap for the backoff so that 2**n never overflows a float.
_MAX_BACKOFF_EXPONENT = 60


@dataclass(frozen=True)
class JudgeClientConfig:
    """How to reach the judge and how hard to try.

    ``url`` is the server's base URL, with or without a trailing ``/v1``.
    ``request_timeout_s`` (``judge_request_timeout_s``) bounds each HTTP attempt end to
    end: pool wait, connect and connection retries, sending, and reading the whole body.
    ``parse_retries`` (``genrm_parse_retries``) is the one retry budget of a comparison.
    ``retry_sleep_s`` (``genrm_parse_retry_sleep_s``) is the first backoff ceiling; it
    doubles per retry up to ``max_retry_sleep_s`` and the actual wait is drawn uniformly
    below it (full jitter). ``connect_retries`` are the transport's own immediate retries
    of failed TCP connects, spent inside one attempt's deadline.
    """

    url: str
    api: JudgeApi
    model: str
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    api_key: str | None = None
    request_timeout_s: float = 1800.0
    parse_retries: int = 3
    retry_sleep_s: float = 0.2
    max_retry_sleep_s: float = 30.0
    default_score: float = 3.0
    default_ranking: float = 3.5
    max_connections: int = 64
    connect_retries: int = 2

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"judge url must start with http:// or https://, got {self.url!r}")
        if self.api not in ("responses", "chat_completions"):
            raise ValueError(
                f"judge api must be 'responses' or 'chat_completions', got {self.api!r}"
            )
        _require_positive_finite("request_timeout_s", self.request_timeout_s)
        _require_non_negative_finite("retry_sleep_s", self.retry_sleep_s)
        _require_non_negative_finite("max_retry_sleep_s", self.max_retry_sleep_s)
        if self.parse_retries < 0:
            raise ValueError(f"parse_retries must be >= 0, got {self.parse_retries}")
        if self.connect_retries < 0:
            raise ValueError(f"connect_retries must be >= 0, got {self.connect_retries}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {self.max_output_tokens}")

    @property
    def endpoint(self) -> str:
        """The full URL that judge requests are POSTed to."""
        base = self.url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        path = "/v1/responses" if self.api == "responses" else "/v1/chat/completions"
        return base + path


@dataclass(frozen=True)
class JudgeInput:
    """What the judge sees for one ordered pair: the conversation and two answers."""

    messages: tuple[tuple[str, str], ...]
    response_1: str
    response_2: str
    principle: str | None = None


@dataclass(frozen=True)
class TokenUsage:
    """Judge tokens spent on one comparison, summed over all of its HTTP attempts."""

    input_tokens: int
    output_tokens: int
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class JudgeOutcome:
    """A verdict (in the caller's order, even when sent swapped) and what it cost."""

    verdict: Verdict
    usage: TokenUsage | None
    attempts: int
    text: str


class JudgeFailedError(Exception):
    """The judge gave no usable answer; ``reason`` says why (at most 2000 characters)."""

    def __init__(self, reason: str, *, kind: str = "failed") -> None:
        self.reason = _truncate(reason, MAX_REASON_CHARS)
        #: What ended the attempt (``deadline``, ``http_400``, ...), for metrics.
        self.kind = kind
        super().__init__(self.reason)


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
    """One HTTP attempt that did not yield a verdict but may be retried."""

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        retry_after: float | None = None,
        text: str = "",
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after
        self.text = text


@dataclass
class _Tally:
    """Book-keeping for one comparison across its attempts."""

    attempts: int = 0
    usage_seen: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    budget_exhausted: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    last_text: str = ""

    def add_usage(self, usage: TokenUsage) -> None:
        self.usage_seen = True
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.reasoning_tokens += usage.reasoning_tokens

    def usage(self) -> TokenUsage | None:
        if not self.usage_seen:
            return None
        return TokenUsage(self.input_tokens, self.output_tokens, self.reasoning_tokens)


class _RetryOnAttemptFailure(retry_base):
    """Retry exactly the attempts that ended in ``_AttemptFailed``; anything else ends."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        return (
            outcome is not None
            and outcome.failed
            and isinstance(outcome.exception(), _AttemptFailed)
        )


class _Backoff(wait_base):
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

    def __call__(self, retry_state: RetryCallState) -> float:
        exponent = min(retry_state.attempt_number - 1, _MAX_BACKOFF_EXPONENT)
        ceiling = min(self._cap, self._first * 2.0**exponent)
        wait = self._random() * ceiling
        outcome = retry_state.outcome
        failure = outcome.exception() if outcome is not None and outcome.failed else None
        if isinstance(failure, _AttemptFailed) and failure.retry_after is not None:
            wait = max(wait, min(failure.retry_after, self._cap))
        return wait


class JudgeClient:
    """Asks the GenRM judge to compare two answers, with retries and a typed failure.

    Owns one pooled ``httpx.AsyncClient``; share one instance across comparisons and
    close it with ``aclose()`` (or use it as an async context manager). The pool holds
    ``max_connections`` connections; a comparison waiting for a free one spends its
    request deadline doing so. An injected ``transport`` brings its own limits and
    connection retries. ``sleep`` and ``random`` are injectable so tests can record
    backoff waits instead of sleeping.
    """

    def __init__(
        self,
        config: JudgeClientConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
        observer: JudgeObserver | None = None,
    ) -> None:
        self._config = config
        self._observer: JudgeObserver = observer or NullJudgeObserver()
        self._endpoint = config.endpoint
        self._sleep = sleep
        self._backoff = _Backoff(config.retry_sleep_s, config.max_retry_sleep_s, random)
        limits = httpx.Limits(
            max_connections=config.max_connections,
            max_keepalive_connections=config.max_connections,
        )
        if transport is None:
            # Connection retries live in the transport so they stay inside the
            # per-attempt deadline rather than spending the comparison's retry budget.
            transport = httpx.AsyncHTTPTransport(retries=config.connect_retries, limits=limits)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._http = httpx.AsyncClient(
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(config.request_timeout_s),
            limits=limits,
        )

    @property
    def config(self) -> JudgeClientConfig:
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
        await self._http.aclose()

    async def judge(self, inp: JudgeInput, *, swap: bool = False) -> JudgeOutcome:
        """Judge one ordered pair.

        With ``swap`` the judge sees ``response_2`` first; the verdict is mapped back to
        the caller's order (scores exchanged, ``ranking' = 7 - ranking``). Raises
        ``JudgeFailedError`` when the judge gave no usable answer.
        """
        cfg = self._config
        sent = replace(inp, response_1=inp.response_2, response_2=inp.response_1) if swap else inp
        payload = self._payload(sent)
        tally = _Tally()
        max_attempts = cfg.parse_retries + 1

        def log_retry(retry_state: RetryCallState) -> None:
            outcome = retry_state.outcome
            failure = outcome.exception() if outcome is not None else None
            wait = retry_state.next_action.sleep if retry_state.next_action else 0.0
            kind = failure.kind if isinstance(failure, _AttemptFailed) else "unknown"
            detail = failure.detail if isinstance(failure, _AttemptFailed) else repr(failure)
            self._observer.judge_retry(kind)
            logger.warning(
                "judge attempt %d/%d failed (%s); retrying in %.3fs: %s",
                retry_state.attempt_number,
                max_attempts,
                kind,
                wait,
                _truncate(detail, _EXCERPT_CHARS),
                extra={
                    "judge_endpoint": self._endpoint,
                    "judge_api": cfg.api,
                    "judge_attempt": retry_state.attempt_number,
                    "judge_max_attempts": max_attempts,
                    "judge_failure_kind": kind,
                    "judge_retry_in_s": wait,
                    "judge_swapped": swap,
                },
            )

        retrying = AsyncRetrying(
            stop=stop_after_attempt(max_attempts),
            wait=self._backoff,
            retry=_RetryOnAttemptFailure(),
            sleep=self._sleep,
            before_sleep=log_retry,
            reraise=True,
        )
        result: tuple[Verdict, str] | None = None
        started = time.perf_counter()
        outcome: ComparisonOutcome = "failed"
        try:
            async for attempt in retrying:
                with attempt:
                    result = await self._attempt(payload, tally)
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except _AttemptFailed as last:
            if last.kind != "unparseable":
                raise JudgeFailedError(self._exhausted_reason(last, tally)) from last
            outcome = "default_verdict"
            logger.warning(
                "judge answer unparseable after %d attempts; using the default verdict",
                tally.attempts,
                extra={
                    "judge_endpoint": self._endpoint,
                    "judge_api": cfg.api,
                    "judge_attempts": tally.attempts,
                    "judge_answer_excerpt": _excerpt(last.text),
                },
            )
            default = Verdict(
                cfg.default_score, cfg.default_score, cfg.default_ranking, parse_failed=True
            )
            result = (default, last.text)
        finally:
            self._observer.judge_comparison(outcome, time.perf_counter() - started)
        assert result is not None  # tenacity either returned a result or raised
        verdict, text = result
        return JudgeOutcome(
            verdict=verdict.swapped() if swap else verdict,
            usage=tally.usage(),
            attempts=tally.attempts,
            text=text,
        )

    def _payload(self, inp: JudgeInput) -> dict[str, Any]:
        cfg = self._config
        conversation = [{"role": role, "content": content} for role, content in inp.messages]
        body: dict[str, Any] = {"model": cfg.model}
        if cfg.api == "responses":
            metadata = {"response_1": inp.response_1, "response_2": inp.response_2}
            if inp.principle:
                metadata["principle"] = inp.principle
            body["input"] = conversation
            body["metadata"] = metadata
            if cfg.max_output_tokens is not None:
                body["max_output_tokens"] = cfg.max_output_tokens
        else:
            messages = list(conversation)
            if inp.principle:
                messages.append({"role": "principle", "content": inp.principle})
            messages.append({"role": "response_1", "content": inp.response_1})
            messages.append({"role": "response_2", "content": inp.response_2})
            body["messages"] = messages
            if cfg.max_output_tokens is not None:
                body["max_tokens"] = cfg.max_output_tokens
        if cfg.temperature is not None:
            body["temperature"] = cfg.temperature
        if cfg.top_p is not None:
            body["top_p"] = cfg.top_p
        return body

    async def _attempt(self, payload: dict[str, Any], tally: _Tally) -> tuple[Verdict, str]:
        """One HTTP attempt: a verdict, or ``_AttemptFailed`` / ``JudgeFailedError``."""
        started = time.perf_counter()
        outcome = "error"  # an unexpected exception (a bug): still counted and timed
        try:
            verdict, text = await self._attempt_verdict(payload, tally)
            outcome = "ok"
        except (_AttemptFailed, JudgeFailedError) as failure:
            outcome = failure.kind
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._observer.judge_request(outcome, time.perf_counter() - started)
        return verdict, text

    async def _attempt_verdict(self, payload: dict[str, Any], tally: _Tally) -> tuple[Verdict, str]:
        cfg = self._config
        tally.attempts += 1
        attempt_no = tally.attempts
        try:
            text = await self._exchange(payload, tally)
        except _AttemptFailed as failure:
            tally.kinds[failure.kind] += 1
            raise
        verdict = parse_verdict(
            text, default_score=cfg.default_score, default_ranking=cfg.default_ranking
        )
        if verdict is None:
            tally.kinds["unparseable"] += 1
            raise _AttemptFailed(
                "unparseable",
                f"attempt {attempt_no}: answer has no valid verdict JSON: {_excerpt(text)}",
                text=text,
            )
        return verdict, text

    async def _exchange(self, payload: dict[str, Any], tally: _Tally) -> str:
        """Send the request; return a completed, non-empty answer text or raise."""
        cfg = self._config
        attempt_no = tally.attempts
        try:
            async with asyncio.timeout(cfg.request_timeout_s):
                response = await self._http.post(self._endpoint, json=payload)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise JudgeFailedError(self._deadline_reason(exc, tally), kind="deadline") from exc
        except httpx.TransportError as exc:
            raise _AttemptFailed("transport", f"attempt {attempt_no}: {_describe(exc)}") from exc
        except httpx.DecodingError as exc:
            raise _AttemptFailed(
                "invalid_body", f"attempt {attempt_no}: undecodable body: {exc}"
            ) from exc

        status = response.status_code
        if status in _RETRYABLE_STATUSES or 500 <= status <= 599:
            raise _AttemptFailed(
                f"http_{status}",
                f"attempt {attempt_no}: HTTP {status}: {_excerpt(response.text)}",
                retry_after=parse_retry_after(response.headers.get("retry-after")),
            )
        if not 200 <= status <= 299:
            raise JudgeFailedError(
                f"judge returned HTTP {status} for POST {self._endpoint} on attempt "
                f"{attempt_no}; not retried (only 408, 429 and 5xx are): "
                f"{_excerpt(response.text)}",
                kind=f"http_{status}",
            )

        try:
            body = json.loads(response.content)
        except ValueError as exc:
            raise _AttemptFailed(
                "invalid_body",
                f"attempt {attempt_no}: HTTP {status} body is not JSON: {_excerpt(response.text)}",
            ) from exc
        if not isinstance(body, dict):
            raise _AttemptFailed(
                "invalid_body",
                f"attempt {attempt_no}: HTTP {status} body is not a JSON object: "
                f"{_excerpt(response.text)}",
            )

        usage = _read_usage(body, cfg.api)
        if usage is not None:
            tally.add_usage(usage)
        try:
            text, state = _read_answer(body, cfg.api)
        except ValueError as exc:
            raise _AttemptFailed(
                "invalid_body", f"attempt {attempt_no}: unexpected answer shape: {exc}"
            ) from exc
        tally.last_text = text

        if state == "budget_exhausted":
            tally.budget_exhausted += 1
            raise _AttemptFailed(
                "incomplete_max_output_tokens",
                f"attempt {attempt_no}: answer incomplete, the judge ran out of output "
                f"tokens (max_output_tokens={_budget_label(cfg.max_output_tokens)})",
            )
        if state != "completed":
            raise _AttemptFailed(
                "incomplete", f"attempt {attempt_no}: answer not completed ({state})"
            )
        if not text.strip():
            raise _AttemptFailed("empty_answer", f"attempt {attempt_no}: completed answer is empty")
        return text

    def _deadline_reason(self, exc: BaseException, tally: _Tally) -> str:
        cfg = self._config
        # NeMo Gym's shared aiohttp client runs without a total timeout, so a hung judge
        # there waits forever; here the deadline is final because it already covered
        # the connection retries and a fresh attempt would just wait as long again.
        reason = (
            f"judge request deadline expired: no complete answer from POST {self._endpoint} "
            f"within judge_request_timeout_s={cfg.request_timeout_s:g}s on attempt "
            f"{tally.attempts} of {cfg.parse_retries + 1} ({type(exc).__name__}); "
            "the deadline is not retried"
        )
        return reason + self._budget_advice(tally) + self._outcome_summary(tally)

    def _exhausted_reason(self, last: _AttemptFailed, tally: _Tally) -> str:
        cfg = self._config
        reason = (
            f"judge gave no usable verdict after {tally.attempts} attempt(s) "
            f"(genrm_parse_retries={cfg.parse_retries}) at POST {self._endpoint}"
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
        budget = _budget_label(self._config.max_output_tokens)
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
        input_key, output_key, details_key = (
            "input_tokens",
            "output_tokens",
            "output_tokens_details",
        )
    else:
        input_key, output_key, details_key = (
            "prompt_tokens",
            "completion_tokens",
            "completion_tokens_details",
        )
    input_tokens = _count(usage.get(input_key))
    output_tokens = _count(usage.get(output_key))
    if input_tokens is None and output_tokens is None:
        return None
    details = usage.get(details_key)
    reasoning = _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    return TokenUsage(input_tokens or 0, output_tokens or 0, reasoning or 0)


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
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


def _require_positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def _require_non_negative_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
