"""Pure scoring: judge pairs, verdict parsing, and group-relative reward aggregation.

No I/O lives here. The default path reproduces NeMo Gym's ``genrm_compare`` exactly;
``aggregate.py`` documents the arithmetic step by step.
"""

from genrm_grpc.scoring.aggregate import (
    RANKING_MIDPOINT,
    StyleCounts,
    aggregate,
    bradley_terry_base_scores,
    group_relative_weights,
    simple_tiebreaker_base_scores,
    style_counts,
    style_density,
)
from genrm_grpc.scoring.extract import extract_texts
from genrm_grpc.scoring.pairs import comparison_pairs, judge_passes
from genrm_grpc.scoring.types import (
    AggregatorMethod,
    AnswerTexts,
    ComparisonStrategy,
    GroupScores,
    JudgedPair,
    MemberScore,
    ScoringView,
    Verdict,
)
from genrm_grpc.scoring.verdict import find_json_objects, parse_verdict

__all__ = [
    "RANKING_MIDPOINT",
    "AggregatorMethod",
    "AnswerTexts",
    "ComparisonStrategy",
    "GroupScores",
    "JudgedPair",
    "MemberScore",
    "ScoringView",
    "StyleCounts",
    "Verdict",
    "aggregate",
    "bradley_terry_base_scores",
    "comparison_pairs",
    "extract_texts",
    "find_json_objects",
    "group_relative_weights",
    "judge_passes",
    "parse_verdict",
    "simple_tiebreaker_base_scores",
    "style_counts",
    "style_density",
]
