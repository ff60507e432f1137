"""Small observer protocols that the runtime, the judge client and the servicer call.

Each call is synchronous, cheap and must not raise. The defaults do nothing, so the core
works (and is tested) without any observer.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Literal, Protocol

from genrm_grpc.cohort.model import CohortKey

CohortOutcome = Literal["completed", "masked", "failed"]
ComparisonOutcome = Literal["ok", "default_verdict", "failed", "cancelled"]


class JudgeObserver(Protocol):
    def judge_request(self, outcome: str, seconds: float) -> None:
        """One HTTP attempt ended: ``ok`` or its failure kind (``http_503``, ``deadline``...)."""

    def judge_retry(self, cause: str) -> None:
        """A failed attempt of kind ``cause`` is retried (after a backoff)."""

    def judge_comparison(self, outcome: ComparisonOutcome, seconds: float) -> None:
        """One logical comparison (all its attempts and backoffs) ended."""


class RuntimeObserver(Protocol):
    def cohort_started(self, key: CohortKey) -> None:
        """A cohort received its first member."""

    def cohort_finished(self, key: CohortKey, outcome: CohortOutcome, age_s: float) -> None:
        """A cohort reached its terminal disposition (published to its waiters)."""


class NullJudgeObserver:
    def judge_request(self, outcome: str, seconds: float) -> None:
        pass

    def judge_retry(self, cause: str) -> None:
        pass

    def judge_comparison(self, outcome: ComparisonOutcome, seconds: float) -> None:
        pass


class NullRuntimeObserver:
    def cohort_started(self, key: CohortKey) -> None:
        pass

    def cohort_finished(self, key: CohortKey, outcome: CohortOutcome, age_s: float) -> None:
        pass


class ServiceObserver(Protocol):
    def member_result(self, result: str) -> None:
        """A member submission was accepted, attached or replayed."""

    def member_rejected(self, reason: str) -> None:
        """A member submission was refused with this ErrorInfo reason."""

    def masked_result(self) -> None:
        """A masked (judge failed) member result was returned."""

    def compare_finished(self, outcome: str) -> None:
        """A Compare call ended: ``ok``, ``judge_failed`` or ``rejected``."""

    def auth_denied(self, why: str) -> None:
        """A call was refused for a ``missing`` or ``invalid`` bearer token."""


class NullServiceObserver:
    def member_result(self, result: str) -> None:
        pass

    def member_rejected(self, reason: str) -> None:
        pass

    def masked_result(self) -> None:
        pass

    def compare_finished(self, outcome: str) -> None:
        pass

    def auth_denied(self, why: str) -> None:
        pass


class SubmitTracer(Protocol):
    def submitting(self, key: CohortKey) -> AbstractContextManager[None]:
        """Entered around one member's runtime submission (links the call to its cohort)."""


class FanoutJudgeObserver:
    """Calls several judge observers (metrics and tracing at once)."""

    def __init__(self, *observers: JudgeObserver) -> None:
        self._observers = observers

    def judge_request(self, outcome: str, seconds: float) -> None:
        for o in self._observers:
            o.judge_request(outcome, seconds)

    def judge_retry(self, cause: str) -> None:
        for o in self._observers:
            o.judge_retry(cause)

    def judge_comparison(self, outcome: ComparisonOutcome, seconds: float) -> None:
        for o in self._observers:
            o.judge_comparison(outcome, seconds)


class FanoutRuntimeObserver:
    """Calls several runtime observers."""

    def __init__(self, *observers: RuntimeObserver) -> None:
        self._observers = observers

    def cohort_started(self, key: CohortKey) -> None:
        for o in self._observers:
            o.cohort_started(key)

    def cohort_finished(self, key: CohortKey, outcome: CohortOutcome, age_s: float) -> None:
        for o in self._observers:
            o.cohort_finished(key, outcome, age_s)


class NullSubmitTracer:
    def submitting(self, key: CohortKey) -> AbstractContextManager[None]:
        return nullcontext()
