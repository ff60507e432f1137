"""Value types shared by the scoring functions, the judge client and the cohort runtime."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

ComparisonStrategy = Literal["circular", "all_pairs"]
AggregatorMethod = Literal["simple_tiebreaker", "bradley_terry"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judge verdict on one ordered pair (response_1, response_2)."""

    score_1: float
    score_2: float
    ranking: float
    parse_failed: bool = False

    def swapped(self) -> Verdict:
        """The same verdict seen from the other side (used to undo position swaps)."""
        return Verdict(self.score_2, self.score_1, 7.0 - self.ranking, self.parse_failed)


@dataclass(frozen=True, slots=True)
class AnswerTexts:
    """The two texts of one candidate answer, as extracted from the member's payload."""

    reasoning: str
    answer: str

    def judge_text(self) -> str:
        """What the judge sees: the answer, or the literal ``None`` when it is blank."""
        return self.answer if self.answer.strip() else "None"


@dataclass(frozen=True, slots=True)
class JudgedPair:
    """A verdict attached to the pair of members (by index) it judged."""

    response_i: int
    response_j: int
    judge_index: int
    verdict: Verdict


class ScoringView(Protocol):
    """The aggregation knobs, named as in NeMo Gym's genrm_compare configuration.

    A read-only scoped view: ``genrm_grpc.config.Settings`` declares (and validates) each
    key once and satisfies this protocol, so scoring stays free of pydantic.
    """

    @property
    def comparison_strategy(self) -> ComparisonStrategy: ...
    @property
    def num_judges_per_comparison(self) -> int: ...
    @property
    def aggregator_method(self) -> AggregatorMethod: ...
    @property
    def reasoning_bonus(self) -> float: ...
    @property
    def answer_bonus(self) -> float: ...
    @property
    def top_percentile(self) -> float: ...
    @property
    def group_reasoning_length_penalty_coeff(self) -> float: ...
    @property
    def group_answer_length_penalty_coeff(self) -> float: ...
    @property
    def group_style_penalty_coeff(self) -> float: ...
    @property
    def default_score(self) -> float: ...
    @property
    def default_ranking(self) -> float: ...


@dataclass(frozen=True, slots=True)
class MemberScore:
    """The reward of one member and how it was reached."""

    reward: float
    score_raw: float
    overall_score: float
    length_adjustment: float


@dataclass(frozen=True, slots=True)
class GroupScores:
    """Rewards for a whole group (one per member, in member order) plus group metrics."""

    members: tuple[MemberScore, ...]
    metrics: Mapping[str, float] = field(default_factory=dict)
