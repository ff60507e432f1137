"""The judge client's value types: what a comparison takes, returns and fails with, what
the readiness and model checks report, and who hears about reachability.

Plain data with no I/O, imported by the runtime as well as by ``judge/client.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from genrm_grpc.judge.farm import Endpoint
from genrm_grpc.judge.texts import truncate
from genrm_grpc.scoring.types import Verdict

MAX_REASON_CHARS = 2000
"""Failure reasons travel to collectors in ``failure_reason``; the protocol caps them."""


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
        self.reason = truncate(reason, MAX_REASON_CHARS)
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
