"""Aggregation: tie-breaking, bonuses, length/style weights, metrics, Bradley–Terry."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.scoring import (
    AnswerTexts,
    JudgedPair,
    StyleCounts,
    Verdict,
    aggregate,
    group_relative_weights,
    style_counts,
    style_density,
)


def _judged(*rows: tuple[int, int, float, float, float]) -> list[JudgedPair]:
    return [JudgedPair(i, j, 0, Verdict(s1, s2, r)) for i, j, s1, s2, r in rows]


def _texts(n: int) -> list[AnswerTexts]:
    return [AnswerTexts("", "") for _ in range(n)]


def _rewards(
    texts: Sequence[AnswerTexts], judged: Sequence[JudgedPair], **params: float
) -> list[float]:
    scores = aggregate(texts, judged, Settings(**params))  # type: ignore[arg-type]
    return [member.reward for member in scores.members]


# --- base scores -------------------------------------------------------------------


def test_member_score_is_the_mean_of_its_scores_across_verdicts() -> None:
    # circular N=3: m0 = (4 + 4) / 2, m1 = (2 + 3) / 2, m2 = (5 + 3) / 2
    judged = _judged((0, 1, 4, 2, 1), (1, 2, 3, 5, 5), (2, 0, 3, 4, 4))
    assert _rewards(_texts(3), judged) == [4.0, 2.5, 4.0]


def test_tie_adds_three_point_five_minus_ranking_to_first_score() -> None:
    # 3 == 3, ranking 2: adjust = 3.5 - 2 = 1.5 -> first 3 + 1.5, second 3 - 1.5
    assert _rewards(_texts(2), _judged((0, 1, 3, 3, 2))) == [4.5, 1.5]


def test_tie_with_ranking_above_midpoint_favours_the_second_answer() -> None:
    # adjust = 3.5 - 6 = -2.5 -> first 2 - 2.5 = -0.5, second 2 + 2.5 = 4.5
    assert _rewards(_texts(2), _judged((0, 1, 2, 2, 6))) == [-0.5, 4.5]


def test_ranking_is_ignored_when_scores_differ() -> None:
    assert _rewards(_texts(2), _judged((0, 1, 4, 2, 6))) == [4.0, 2.0]


def test_member_without_verdicts_gets_default_score() -> None:
    judged = _judged((0, 1, 5, 1, 1))
    assert _rewards(_texts(3), judged, default_score=2.0) == [5.0, 1.0, 2.0]


def test_singleton_group_gets_default_score_and_no_adjustment() -> None:
    params = {"reasoning_bonus": 1.0, "group_style_penalty_coeff": 1.0}
    scores = aggregate([AnswerTexts("r", "# a")], [], Settings(**params))  # type: ignore[arg-type]
    assert scores.members[0].reward == 3.0
    assert scores.members[0].length_adjustment == 0.0
    assert dict(scores.metrics) == {"genrm_parse_failure_rate_per_group": 0.0}


def test_pairs_outside_the_group_are_rejected() -> None:
    with pytest.raises(ValueError, match="outside a group"):
        aggregate(_texts(2), _judged((0, 2, 4, 2, 1)), Settings())


def test_unknown_aggregator_is_rejected() -> None:
    params = Settings.model_construct(aggregator_method="majority")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown aggregator"):
        aggregate(_texts(2), [], params)


# --- top-percentile bonuses ----------------------------------------------------------


def _four_member_group() -> tuple[list[AnswerTexts], list[JudgedPair]]:
    # base scores 5, 4, 3, 2 (each member appears in exactly one verdict)
    judged = _judged((0, 1, 5, 4, 3), (2, 3, 3, 2, 3))
    texts = [
        AnswerTexts("rrrr", "a"),
        AnswerTexts("rrr", "a"),
        AnswerTexts("r", "a"),
        AnswerTexts("rr", "a"),
    ]
    return texts, judged


@pytest.mark.parametrize(
    ("top_percentile", "expected_rank"),
    [
        (0.2, 0),  # int(4 * 0.2) - 1 = -1 -> clamped to 0: the best score is the bar
        (0.5, 1),  # int(2.0) - 1 = 1
        (0.75, 2),  # int(3.0) - 1 = 2
        (1.0, 3),  # int(4.0) - 1 = 3: everyone clears the bar
    ],
)
def test_bonus_bar_is_the_score_at_int_n_times_percentile_minus_one(
    top_percentile: float, expected_rank: int
) -> None:
    texts, judged = _four_member_group()
    # Member 2 (score 3, i.e. rank 2) has the shortest reasoning.
    rewards = _rewards(texts, judged, reasoning_bonus=1.0, top_percentile=top_percentile)
    gets_bonus = expected_rank >= 2
    assert rewards[2] == (4.0 if gets_bonus else 3.0)


def test_bar_index_truncates_a_fractional_product() -> None:
    # Base scores 5, 4, 3, 2; member 1 (score 4) has the shortest reasoning.
    # 4 * 0.45 = 1.8 -> int 1 -> index 0 -> bar 5: no bonus (rounding would give 4).
    # 4 * 0.5 = 2.0 -> index 1 -> bar 4: bonus.
    _, judged = _four_member_group()
    texts = [
        AnswerTexts("rrrr", ""),
        AnswerTexts("r", ""),
        AnswerTexts("rr", ""),
        AnswerTexts("rrr", ""),
    ]
    assert _rewards(texts, judged, reasoning_bonus=1.0, top_percentile=0.45)[1] == 4.0
    assert _rewards(texts, judged, reasoning_bonus=1.0, top_percentile=0.5)[1] == 5.0


def test_percentile_beyond_the_group_is_rejected() -> None:
    texts, judged = _four_member_group()
    with pytest.raises(ValueError, match="top_percentile"):
        _rewards(texts, judged, reasoning_bonus=1.0, top_percentile=1.5)


def test_first_of_equally_short_reasonings_gets_the_bonus_or_nobody_does() -> None:
    # Members 1 and 3 both have 1-char reasoning; member 1 comes first but scores 1,
    # below the bar (best score 5), so nobody gets the bonus, not even member 3 (5).
    judged = _judged((0, 1, 2, 1, 3), (2, 3, 3, 5, 3))
    texts = [
        AnswerTexts("rr", ""),
        AnswerTexts("r", ""),
        AnswerTexts("rrr", ""),
        AnswerTexts("r", ""),
    ]
    assert _rewards(texts, judged, reasoning_bonus=1.0) == [2.0, 1.0, 3.0, 5.0]


def test_empty_reasoning_is_not_eligible_for_the_shortest_bonus() -> None:
    judged = _judged((0, 1, 5, 4, 3))
    texts = [AnswerTexts("   ", "a"), AnswerTexts("long reasoning", "a")]
    # Member 0's reasoning strips to nothing; member 1 is the only candidate but 4 < 5.
    assert _rewards(texts, judged, reasoning_bonus=1.0) == [5.0, 4.0]
    # With the bar at the lowest score, member 1 qualifies.
    assert _rewards(texts, judged, reasoning_bonus=1.0, top_percentile=1.0) == [5.0, 5.0]


def test_member_with_shortest_reasoning_and_answer_gets_both_bonuses() -> None:
    judged = _judged((0, 1, 5, 4, 3))
    texts = [AnswerTexts("r", "a"), AnswerTexts("rr", "aa")]
    scores = aggregate(texts, judged, Settings(reasoning_bonus=0.5, answer_bonus=0.25))
    assert [m.reward for m in scores.members] == [5.75, 4.0]
    assert [m.length_adjustment for m in scores.members] == [0.75, 0.0]
    assert [m.score_raw for m in scores.members] == [5.0, 4.0]


# --- group-relative weights ------------------------------------------------------------


def test_group_relative_weights_favour_the_smallest_and_are_zero_centred() -> None:
    # lengths 0, 2, 4 -> raw 1, 0.5, 0 -> mean 0.5 -> 0.5, 0, -0.5
    assert group_relative_weights([0, 2, 4]) == [0.5, 0.0, -0.5]


def test_group_relative_weights_are_zero_when_all_values_are_equal() -> None:
    assert group_relative_weights([7, 7, 7]) == [0.0, 0.0, 0.0]


def test_length_penalty_combines_reasoning_and_answer_weights() -> None:
    # reasoning lengths 1, 3 -> weights 0.5, -0.5; answer lengths 4, 2 -> -0.5, 0.5
    # m0: 0.5 * 0.4 + (-0.5) * 0.2 = 0.1 ; m1: -0.5 * 0.4 + 0.5 * 0.2 = -0.1
    texts = [AnswerTexts(" r ", "aaaa"), AnswerTexts("rrr", "aa")]
    judged = _judged((0, 1, 4, 3, 2))
    rewards = _rewards(
        texts,
        judged,
        group_reasoning_length_penalty_coeff=0.4,
        group_answer_length_penalty_coeff=0.2,
    )
    assert rewards == pytest.approx([4.1, 2.9], abs=1e-12)


# --- style ---------------------------------------------------------------------------------


def test_style_counts_headers_lists_bold_and_emoji_outside_code_blocks() -> None:
    text = "\n".join(
        [
            "# Title",  # header
            "####### seven hashes is no header",
            "## Sub",  # header
            "1. first",  # ordered item
            "  - nested",  # unordered item
            "* star",  # unordered item
            "-not an item",
            "**bold** and __bold__ and **not\nbold**",  # two bold runs
            "Nice 😀✅",  # two emoji
            "```md\n# hidden\n- hidden\n**hidden** 😀\n```",
        ]
    )
    assert style_counts(text) == StyleCounts(headers=2, list_items=3, bold=2, emoji=2)


def test_style_density_divides_by_the_stripped_length_without_code() -> None:
    # "# Title\nPlain" has 1 element over 13 characters; the code block is not counted
    # in either the numerator or the denominator.
    assert style_density("\n# Title\nPlain\n```py\n- x\n```  ") == pytest.approx(1 / 13)
    # An indented "#" is not at a line start, so it is no header (but still length).
    assert style_density("  # Title\nPlain") == 0.0
    assert style_density("```\n# only code\n```") == 0.0
    assert style_density("   ") == 0.0


def test_list_pattern_may_start_on_a_blank_line() -> None:
    # "^\s*" spans the empty line, so the match starts on the blank line: still one item.
    assert style_counts("\n\n- item").list_items == 1


def test_wide_emoji_range_counts_cjk_characters() -> None:
    # U+24C2..U+1F251 covers CJK ideographs: the reference counts each as an emoji.
    assert style_counts("你好").emoji == 2
    assert style_density("你好") == 1.0


def test_style_penalty_rewards_plainer_answers() -> None:
    # densities 0 and 3/20 -> weights 0.5, -0.5 -> times coeff 1.0
    texts = [AnswerTexts("", "plain answer"), AnswerTexts("", "# Title\n- item\n**bold**")]
    scores = aggregate(texts, _judged((0, 1, 3, 3, 3.5)), Settings(group_style_penalty_coeff=1.0))
    assert [m.reward for m in scores.members] == [3.5, 2.5]
    assert [m.length_adjustment for m in scores.members] == [0.5, -0.5]
    assert [m.score_raw for m in scores.members] == [3.0, 3.0]


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_use_raw_scores_population_std_and_tie_share() -> None:
    judged = _judged((0, 1, 3, 3, 2), (1, 0, 5, 1, 1))
    judged.append(JudgedPair(0, 1, 1, Verdict(3.0, 3.0, 3.5, parse_failed=True)))
    metrics = aggregate(_texts(2), judged, Settings()).metrics
    # individual scores 3, 3, 5, 1, 3, 3 (before tie-breaking): mean 3,
    # squared deviations 0, 0, 4, 4, 0, 0 -> variance 8/6
    assert metrics["mean_individual_score"] == 3.0
    assert metrics["std_individual_score"] == pytest.approx(math.sqrt(8 / 6), abs=1e-15)
    assert metrics["tiebreak_usage_rate"] == pytest.approx(2 / 3)
    assert metrics["genrm_parse_failure_rate_per_group"] == pytest.approx(1 / 3)


def test_without_verdicts_only_the_parse_failure_rate_is_reported_as_zero() -> None:
    metrics = aggregate(_texts(3), [], Settings()).metrics
    assert dict(metrics) == {"genrm_parse_failure_rate_per_group": 0.0}


def test_overall_score_equals_reward_and_raw_score_is_the_base() -> None:
    texts = [AnswerTexts("r", "a"), AnswerTexts("rr", "aa")]
    scores = aggregate(texts, _judged((0, 1, 5, 4, 3)), Settings(reasoning_bonus=0.5))
    first = scores.members[0]
    assert (first.reward, first.overall_score, first.score_raw) == (5.5, 5.5, 5.0)


# --- Bradley–Terry ---------------------------------------------------------------------------


def _bt(texts_n: int, judged: Sequence[JudgedPair]) -> list[float]:
    params = Settings(aggregator_method="bradley_terry")
    return [m.reward for m in aggregate(_texts(texts_n), judged, params).members]


def test_bradley_terry_orders_a_transitive_chain() -> None:
    # 0 beats 1 and 2, 1 beats 2 (all_pairs)
    rewards = _bt(3, _judged((0, 1, 4, 2, 1), (0, 2, 4, 2, 2), (1, 2, 4, 2, 3)))
    assert rewards[0] > rewards[1] > rewards[2]
    assert all(1.0 < r < 5.0 for r in rewards)
    assert sum(rewards) / 3 == pytest.approx(3.0, abs=0.5)


def test_bradley_terry_uses_ranking_not_scores() -> None:
    # Scores claim the first answer is better, the ranking (6) says the second.
    rewards = _bt(2, _judged((0, 1, 5, 1, 6)))
    assert rewards[1] > rewards[0]


def test_bradley_terry_draws_and_parse_failures_leave_everyone_at_default() -> None:
    judged = _judged((0, 1, 3, 3, 3.5), (1, 2, 2, 4, 3.5))
    judged.append(JudgedPair(2, 0, 0, Verdict(3.0, 3.0, 1.0, parse_failed=True)))
    assert _bt(3, judged) == pytest.approx([3.0, 3.0, 3.0], abs=1e-9)


def test_bradley_terry_is_symmetric_for_mirrored_outcomes() -> None:
    rewards = _bt(2, _judged((0, 1, 4, 2, 1)))
    assert rewards[0] - 3.0 == pytest.approx(3.0 - rewards[1], abs=1e-9)


def test_bradley_terry_bigger_margins_give_bigger_gaps() -> None:
    narrow = _bt(2, _judged((0, 1, 4, 2, 3)))
    wide = _bt(2, _judged((0, 1, 4, 2, 1)))
    assert wide[0] - wide[1] > narrow[0] - narrow[1] > 0


def test_bradley_terry_member_without_games_gets_default() -> None:
    assert _bt(3, _judged((0, 1, 4, 2, 1)))[2] == 3.0


def test_bonuses_apply_after_bradley_terry_too() -> None:
    texts = [AnswerTexts("r", "a"), AnswerTexts("rr", "a")]
    judged = _judged((0, 1, 4, 2, 1))
    params = Settings(aggregator_method="bradley_terry", reasoning_bonus=0.5)
    members = aggregate(texts, judged, params).members
    assert members[0].reward == members[0].score_raw + 0.5
    assert members[1].reward == members[1].score_raw
