"""The texts the judge client writes: excerpts for logs and the reasons a comparison failed.

What reaches a collector (``JudgeFailedError.reason``, ``failure_reason`` on the wire)
names the failure class, HTTP status and the settings involved, never the judge's
address; texts meant for operators' logs (``describe``) pass through the client's
``Redactor`` first. Pure functions of their arguments.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genrm_grpc.judge.attempts import AttemptFailed, Tally
    from genrm_grpc.judge.views import JudgeView

EXCERPT_CHARS = 300
"""How much of an answer or body a log line quotes."""


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def excerpt(text: str) -> str:
    return truncate(" ".join(text.split()), EXCERPT_CHARS) or "<empty>"


def excerpt_bytes(raw: bytes) -> str:
    return excerpt(raw[: 4 * EXCERPT_CHARS].decode("utf-8", errors="replace"))


def budget_label(max_output_tokens: int | None) -> str:
    return "unset" if max_output_tokens is None else str(max_output_tokens)


def describe(exc: BaseException) -> str:
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


def failure_class(exc: BaseException) -> str:
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


def deadline_reason(cfg: JudgeView, tally: Tally) -> str:
    # NeMo Gym's shared aiohttp client runs without a total timeout, so a hung judge
    # there waits forever; here the deadline is final because it already covered
    # the connection retries and a fresh attempt would just wait as long again.
    reason = (
        "judge request deadline expired: no complete answer within "
        f"judge_request_timeout_s={cfg.judge_request_timeout_s:g}s on attempt "
        f"{tally.attempts} of {cfg.genrm_parse_retries + 1}; the deadline is not retried"
    )
    if cfg.judge_outage_tolerance_s > 0:
        reason += f" beyond judge_outage_tolerance_s={cfg.judge_outage_tolerance_s:g}s of outage"
    return reason + budget_advice(cfg, tally) + outcome_summary(tally)


def first_token_reason(cfg: JudgeView, tally: Tally) -> str:
    reason = (
        "judge sent no first token within judge.first_token_timeout_s="
        f"{cfg.judge.first_token_timeout_s:g}s on attempt {tally.attempts} of "
        f"{cfg.genrm_parse_retries + 1}; with one endpoint a hung request is not "
        "retried (as judge_request_timeout_s)"
    )
    if cfg.judge_outage_tolerance_s > 0:
        reason += f" beyond judge_outage_tolerance_s={cfg.judge_outage_tolerance_s:g}s of outage"
    return reason + budget_advice(cfg, tally) + outcome_summary(tally)


def exhausted_reason(cfg: JudgeView, last: AttemptFailed, tally: Tally) -> str:
    reason = (
        f"judge gave no usable verdict after {tally.attempts} attempt(s) "
        f"(genrm_parse_retries={cfg.genrm_parse_retries})"
    )
    return (
        reason
        + budget_advice(cfg, tally)
        + outcome_summary(tally)
        + f"; last attempt: {last.detail}"
    )


def budget_advice(cfg: JudgeView, tally: Tally) -> str:
    if not tally.budget_exhausted:
        return ""
    budget = budget_label(cfg.judge.max_output_tokens)
    return (
        f"; {tally.budget_exhausted} of {tally.attempts} attempt(s) ended incomplete "
        f"because the judge used up its output budget (max_output_tokens={budget}): "
        "raise the judge output budget or constrain the judge's reasoning "
        "(e.g. a lower reasoning effort or a thinking-token budget)"
    )


def outcome_summary(tally: Tally) -> str:
    if not tally.kinds:
        return ""
    parts = ", ".join(f"{kind}×{count}" for kind, count in sorted(tally.kinds.items()))
    return f"; failed attempts: {parts}"
