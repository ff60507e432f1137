"""One comparison's attempts: how a failed attempt is told apart, counted and waited on.

``AttemptFailed`` is an attempt that produced no verdict but may be retried, ``Tally``
the book-keeping across a comparison's attempts (budget, outage window, tokens) and
``Backoff`` the wait before the next one. Internal to the judge client
(``judge/client.py``, ``judge/transport.py``); no I/O.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import NoReturn

from genrm_grpc.judge.budget import AdaptiveBudget
from genrm_grpc.judge.farm import Endpoint
from genrm_grpc.judge.texts import deadline_reason, first_token_reason
from genrm_grpc.judge.types import JudgeFailedError, JudgeProgress, TokenUsage
from genrm_grpc.judge.views import JudgeView
from genrm_grpc.scoring.verdict import AttemptEnd, AttemptsDecision

RETRYABLE_STATUSES = frozenset({408, 429})
"""Statuses retried besides 5xx."""

OUTAGE_STATUSES = frozenset({502, 503, 504})
"""Statuses that mean the judge is not there (``judge_outage_tolerance_s`` covers them)."""

# Exponent cap for the backoff so that 2**n never overflows a float.
_MAX_BACKOFF_EXPONENT = 60


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


class AttemptFailed(Exception):
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


ANSWER_KINDS = frozenset({"empty_answer", "incomplete", "incomplete_max_output_tokens"})
"""Failure kinds of an attempt the judge answered (HTTP 2xx) without a completed answer."""


def attempt_end(failure: AttemptFailed) -> AttemptEnd:
    """How a failed attempt ended, in the terms of ``after_failed_attempt``."""
    if failure.answered:
        return "unparseable"
    if failure.kind in ANSWER_KINDS:
        return "unusable_answer"
    return "no_answer"


@dataclass
class Tally:
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

    def next_limit(
        self, budget: AdaptiveBudget | None, cap: int | None, max_attempts: int
    ) -> int | None:
        """The output budget of the next attempt: the adaptive one when it cuts, except
        for the last attempt of a comparison whose every attempt so far it cut (that
        one gets the configured ``cap``, so the adaptive budget alone never masks)."""
        if budget is None or not budget.cuts():
            return cap
        last = self.budget_spent >= max_attempts - 1
        if last and self.attempts > 0 and self.adaptive_cuts == self.attempts:
            return cap
        return budget.current()

    def spend(self, failure: AttemptFailed, tolerance: float, now: Callable[[], float]) -> None:
        """Decide whether a failed attempt spends the budget (``tolerance``: the seconds
        of continuous outage that ``judge_outage_tolerance_s`` covers)."""
        if failure.answered:
            self.answered = True
        if failure.outage and tolerance > 0:
            current = now()
            if self.outage_since is None:
                self.outage_since = current
            if current - self.outage_since < tolerance:
                failure.spent_budget = False
                return
        else:
            self.outage_since = None
        self.budget_spent += 1

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


class Backoff:
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

    def wait(self, attempt_number: int, failure: AttemptFailed) -> float:
        exponent = min(attempt_number - 1, _MAX_BACKOFF_EXPONENT)
        ceiling = min(self._cap, self._first * 2.0**exponent)
        wait = self._random() * ceiling
        if failure.retry_after is not None:
            wait = max(wait, min(failure.retry_after, self._cap))
        return wait


def hung(
    cfg: JudgeView,
    farm_size: int,
    now: Callable[[], float],
    kind: str,
    detail: str,
    tally: Tally,
) -> NoReturn:
    """A request that got no answer in time (its deadline, or no first token).

    In a farm of two or more another endpoint may answer: the attempt fails, spends
    the budget and the retry goes elsewhere. With one endpoint, Gym's rule: final,
    unless ``judge_outage_tolerance_s`` still covers it. Raises either way."""
    if farm_size >= 2:
        raise AttemptFailed(kind, detail) from None
    if cfg.judge_outage_tolerance_s > 0:
        current = now()
        since = tally.outage_since if tally.outage_since is not None else current
        if current - since < cfg.judge_outage_tolerance_s:
            raise AttemptFailed(kind, detail, outage=True) from None
    if kind == "first_token":
        raise JudgeFailedError(first_token_reason(cfg, tally), kind=kind) from None
    raise JudgeFailedError(deadline_reason(cfg, tally), kind=kind) from None
