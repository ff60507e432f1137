"""Hand-computed groups with every bonus and penalty switched on.

Each expected value below was derived step by step from the semantics of NeMo Gym's
``genrm_compare`` (as documented in ``genrm_grpc/scoring/aggregate.py``), not by
running any implementation:

1. base = mean of each member's scores over its verdicts, after the tie rule
   (equal scores: first += 3.5 - ranking, second -= 3.5 - ranking);
2. bar = sorted(base, descending)[max(0, int(N * top_percentile) - 1)], taken once;
3. reasoning bonus to the first shortest non-empty stripped reasoning if score >= bar,
   then answer bonus likewise (against the current score);
4. length shift = w(reasoning lengths) * reasoning_coeff + w(answer lengths) * answer_coeff,
   where w maps min..max onto 1..0 and subtracts the mean;
5. style shift = w(style densities) * style_coeff;
6. metrics over the raw (pre-tie-break) scores, population std.
"""

from __future__ import annotations

import math

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.scoring import (
    AnswerTexts,
    GroupScores,
    JudgedPair,
    Verdict,
    aggregate,
)

TOL = 1e-12


def _check(
    scores: GroupScores,
    *,
    base: list[float],
    reward: list[float],
    adjustment: list[float],
    metrics: dict[str, float],
) -> None:
    assert [m.score_raw for m in scores.members] == pytest.approx(base, abs=TOL)
    assert [m.reward for m in scores.members] == pytest.approx(reward, abs=TOL)
    assert [m.overall_score for m in scores.members] == pytest.approx(reward, abs=TOL)
    assert [m.length_adjustment for m in scores.members] == pytest.approx(adjustment, abs=TOL)
    assert dict(scores.metrics) == pytest.approx(metrics, abs=TOL)


def test_circular_three_members_with_tie_bonus_length_and_style() -> None:
    texts = [
        AnswerTexts("abcd", "# T\nabc"),  # reasoning 4; answer 7 chars, 1 header -> 1/7
        AnswerTexts("", "plain"),  # reasoning 0; answer 5 chars, no style -> 0
        AnswerTexts("ab", "- x\n- y"),  # reasoning 2; answer 7 chars, 2 list items -> 2/7
    ]
    judged = [
        JudgedPair(0, 1, 0, Verdict(4.0, 2.0, 2.0)),  # m0 +4, m1 +2
        JudgedPair(1, 2, 0, Verdict(3.0, 3.0, 5.0)),  # tie: adjust -1.5 -> m1 +1.5, m2 +4.5
        JudgedPair(2, 0, 0, Verdict(5.0, 3.0, 1.0)),  # m2 +5, m0 +3
    ]
    params = Settings(
        reasoning_bonus=0.5,
        answer_bonus=0.25,
        top_percentile=0.5,
        group_reasoning_length_penalty_coeff=0.3,
        group_answer_length_penalty_coeff=0.2,
        group_style_penalty_coeff=1.0,
    )
    # base: m0 (4+3)/2 = 3.5, m1 (2+1.5)/2 = 1.75, m2 (4.5+5)/2 = 4.75
    # bar: int(3 * 0.5) - 1 = 0 -> [4.75, 3.5, 1.75][0] = 4.75
    # reasoning bonus: non-empty lengths m0 4, m2 2 -> m2; 4.75 >= 4.75 -> m2 = 5.25
    # answer bonus: lengths 7, 5, 7 -> m1; 1.75 < 4.75 -> none
    # reasoning weights [4, 0, 2]: raw [0, 1, 0.5], mean 0.5 -> [-0.5, 0.5, 0]
    # answer weights [7, 5, 7]: raw [0, 1, 0], mean 1/3 -> [-1/3, 2/3, -1/3]
    # shift: m0 -0.15 - 1/15, m1 0.15 + 2/15, m2 0 - 1/15
    # style densities [1/7, 0, 2/7]: raw [0.5, 1, 0], mean 0.5 -> [0, 0.5, -0.5] * 1.0
    m0_length = -0.15 - 1 / 15
    m1_length = 0.15 + 2 / 15
    m2_length = -1 / 15
    _check(
        aggregate(texts, judged, params),
        base=[3.5, 1.75, 4.75],
        reward=[3.5 + m0_length, 1.75 + m1_length + 0.5, 4.75 + 0.5 + m2_length - 0.5],
        adjustment=[m0_length, m1_length + 0.5, 0.5 + m2_length - 0.5],
        # raw scores 4, 2, 3, 3, 5, 3: mean 10/3; squared deviations sum 48/9 -> var 8/9
        metrics={
            "mean_individual_score": 10 / 3,
            "std_individual_score": math.sqrt(8 / 9),
            "tiebreak_usage_rate": 1 / 3,
            "genrm_parse_failure_rate_per_group": 0.0,
        },
    )


def test_all_pairs_four_members_first_of_minimal_decides_the_bonus() -> None:
    texts = [
        AnswerTexts("xyz", "Hi."),  # reasoning 3, answer 3
        AnswerTexts("", "Hello"),  # reasoning 0, answer 5
        AnswerTexts("  ab  ", "**Bold** answer"),  # reasoning strips to 2, answer 15
        AnswerTexts("cd", "Hi!"),  # reasoning 2, answer 3
    ]
    judged = [
        JudgedPair(0, 1, 0, Verdict(4.0, 4.0, 2.0)),  # tie +1.5: m0 5.5, m1 2.5
        JudgedPair(0, 2, 0, Verdict(5.0, 2.0, 1.0)),  # m0 5, m2 2
        JudgedPair(0, 3, 0, Verdict(3.0, 4.0, 5.0)),  # m0 3, m3 4
        JudgedPair(1, 2, 0, Verdict(2.0, 2.0, 6.0)),  # tie -2.5: m1 -0.5, m2 4.5
        JudgedPair(1, 3, 0, Verdict(1.0, 5.0, 6.0)),  # m1 1, m3 5
        JudgedPair(2, 3, 0, Verdict(4.0, 3.0, 2.0)),  # m2 4, m3 3
    ]
    params = Settings(
        comparison_strategy="all_pairs",
        reasoning_bonus=1.0,
        answer_bonus=0.5,
        top_percentile=0.5,
        group_reasoning_length_penalty_coeff=0.4,
        group_answer_length_penalty_coeff=0.0,
        group_style_penalty_coeff=0.2,
    )
    # base: m0 13.5/3 = 4.5, m1 3/3 = 1, m2 10.5/3 = 3.5, m3 12/3 = 4
    # bar: int(4 * 0.5) - 1 = 1 -> [4.5, 4, 3.5, 1][1] = 4
    # reasoning bonus: shortest non-empty is 2 for m2 and m3; the first (m2) is chosen,
    #   3.5 < 4 -> nobody gets it (m3 would have qualified but is not considered)
    # answer bonus: shortest 3 for m0 and m3 -> m0; 4.5 >= 4 -> m0 = 5.0
    # reasoning weights [3, 0, 2, 2]: raw [0, 1, 1/3, 1/3], mean 5/12
    #   -> [-5/12, 7/12, -1/12, -1/12] * 0.4 = [-1/6, 7/30, -1/30, -1/30]
    #   (answer weights are multiplied by 0.0 and add nothing)
    # style densities [0, 0, 1/15, 0]: raw [1, 1, 0, 1], mean 0.75
    #   -> [0.25, 0.25, -0.75, 0.25] * 0.2 = [0.05, 0.05, -0.15, 0.05]
    _check(
        aggregate(texts, judged, params),
        base=[4.5, 1.0, 3.5, 4.0],
        reward=[
            4.5 + 0.5 - 1 / 6 + 0.05,
            1.0 + 7 / 30 + 0.05,
            3.5 - 1 / 30 - 0.15,
            4.0 - 1 / 30 + 0.05,
        ],
        adjustment=[0.5 - 1 / 6 + 0.05, 7 / 30 + 0.05, -1 / 30 - 0.15, -1 / 30 + 0.05],
        # raw scores 4,4,5,2,3,4,2,2,1,5,4,3: mean 39/12 = 3.25;
        # squared deviations 4*0.5625 + 2*3.0625 + 3*1.5625 + 2*0.0625 + 5.0625 = 18.25
        metrics={
            "mean_individual_score": 3.25,
            "std_individual_score": math.sqrt(18.25 / 12),
            "tiebreak_usage_rate": 2 / 6,
            "genrm_parse_failure_rate_per_group": 0.0,
        },
    )


def test_two_members_two_judges_with_a_parse_failure_and_code_block() -> None:
    texts = [
        AnswerTexts("", "```python\nprint(1)\n```\nDone."),  # answer 28 chars; prose "Done."
        AnswerTexts("", "## Result\nDone."),  # answer 15 chars, 1 header -> 1/15
    ]
    judged = [
        JudgedPair(0, 1, 0, Verdict(5.0, 1.0, 1.0)),  # m0 5, m1 1
        JudgedPair(1, 0, 0, Verdict(3.0, 3.0, 3.5, parse_failed=True)),  # default: tie, adjust 0
        JudgedPair(0, 1, 1, Verdict(2.0, 2.0, 4.0)),  # tie -0.5: m0 1.5, m1 2.5
        JudgedPair(1, 0, 1, Verdict(2.0, 4.0, 5.0)),  # m1 2, m0 4
    ]
    params = Settings(
        num_judges_per_comparison=2,
        reasoning_bonus=0.5,
        answer_bonus=0.5,
        top_percentile=0.2,
        group_reasoning_length_penalty_coeff=0.7,
        group_answer_length_penalty_coeff=1.0,
        group_style_penalty_coeff=0.5,
    )
    # base: m0 (5+3+1.5+4)/4 = 3.375, m1 (1+3+2.5+2)/4 = 2.125
    # bar: max(0, int(0.4) - 1) = 0 -> 3.375
    # reasoning bonus: no non-empty reasoning -> none
    # answer bonus: lengths 28, 15 -> m1; 2.125 < 3.375 -> none
    # reasoning weights: all lengths 0 -> [0, 0]
    # answer weights [28, 15]: raw [0, 1], mean 0.5 -> [-0.5, 0.5] * 1.0
    # style: m0 prose "Done." has no style -> 0; m1 1/15 -> weights [0.5, -0.5] * 0.5
    _check(
        aggregate(texts, judged, params),
        base=[3.375, 2.125],
        reward=[3.375 - 0.5 + 0.25, 2.125 + 0.5 - 0.25],
        adjustment=[-0.25, 0.25],
        # raw 5,1,3,3,2,2,2,4: mean 2.75; squared deviations sum 11.5 -> var 1.4375
        metrics={
            "mean_individual_score": 2.75,
            "std_individual_score": math.sqrt(1.4375),
            "tiebreak_usage_rate": 0.5,
            "genrm_parse_failure_rate_per_group": 0.25,
        },
    )


def test_emoji_and_cjk_count_as_style_and_both_bonuses_stack() -> None:
    texts = [
        AnswerTexts("think", "Great 😀😀"),  # answer 8 chars, 2 emoji -> 0.25
        AnswerTexts("hm", "你好"),  # answer 2 chars, CJK falls in U+24C2..U+1F251 -> 1.0
        AnswerTexts("", "ok fine"),  # answer 7 chars -> 0
    ]
    judged = [
        JudgedPair(0, 1, 0, Verdict(4.0, 3.0, 2.0)),  # m0 4, m1 3
        JudgedPair(1, 2, 0, Verdict(2.0, 5.0, 6.0)),  # m1 2, m2 5
        JudgedPair(2, 0, 0, Verdict(1.0, 1.0, 3.5)),  # tie at the midpoint: adjust 0
    ]
    params = Settings(
        reasoning_bonus=0.75,
        answer_bonus=0.25,
        top_percentile=1.0,
        group_style_penalty_coeff=0.6,
    )
    # base: m0 (4+1)/2 = 2.5, m1 (3+2)/2 = 2.5, m2 (5+1)/2 = 3
    # bar: int(3 * 1.0) - 1 = 2 -> [3, 2.5, 2.5][2] = 2.5
    # reasoning bonus: lengths 5, 2, 0 -> m1; 2.5 >= 2.5 -> 3.25
    # answer bonus: lengths 8, 2, 7 -> m1; current 3.25 >= 2.5 -> 3.5
    # no length coefficients -> no length weights
    # style densities [0.25, 1, 0]: raw [0.75, 0, 1], mean 7/12
    #   -> [1/6, -7/12, 5/12] * 0.6 = [0.1, -0.35, 0.25]
    _check(
        aggregate(texts, judged, params),
        base=[2.5, 2.5, 3.0],
        reward=[2.6, 3.15, 3.25],
        adjustment=[0.1, 0.65, 0.25],
        # raw 4,3,2,5,1,1: mean 8/3; squared deviations (16+1+4+49+25+25)/9 = 120/9 -> var 20/9
        metrics={
            "mean_individual_score": 8 / 3,
            "std_individual_score": math.sqrt(20 / 9),
            "tiebreak_usage_rate": 1 / 3,
            "genrm_parse_failure_rate_per_group": 0.0,
        },
    )


def test_no_verdicts_still_applies_bonuses_to_default_scores() -> None:
    texts = [AnswerTexts("abc", "a"), AnswerTexts("a", "ab"), AnswerTexts("ab", "abc")]
    params = Settings(
        reasoning_bonus=0.5,
        answer_bonus=0.0,
        group_answer_length_penalty_coeff=0.3,
        group_style_penalty_coeff=1.0,
    )
    # base: nobody has a verdict -> 3, 3, 3; bar: index 0 -> 3
    # reasoning bonus: lengths 3, 1, 2 -> m1; 3 >= 3 -> 3.5
    # answer weights [1, 2, 3]: raw [1, 0.5, 0], mean 0.5 -> [0.5, 0, -0.5] * 0.3
    # style: all densities 0 -> no shift
    _check(
        aggregate(texts, [], params),
        base=[3.0, 3.0, 3.0],
        reward=[3.15, 3.5, 2.85],
        adjustment=[0.15, 0.5, -0.15],
        metrics={"genrm_parse_failure_rate_per_group": 0.0},
    )


def test_singleton_is_left_at_the_default_score() -> None:
    params = Settings(
        reasoning_bonus=1.0,
        answer_bonus=1.0,
        group_reasoning_length_penalty_coeff=1.0,
        group_answer_length_penalty_coeff=1.0,
        group_style_penalty_coeff=1.0,
        default_score=2.0,
    )
    # N < 2: no pairs, no bonus stage, no style stage.
    _check(
        aggregate([AnswerTexts("r", "# a")], [], params),
        base=[2.0],
        reward=[2.0],
        adjustment=[0.0],
        metrics={"genrm_parse_failure_rate_per_group": 0.0},
    )
