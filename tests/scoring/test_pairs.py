"""Pair generation and judge-pass ordering."""

from __future__ import annotations

import pytest

from genrm_grpc.scoring import comparison_pairs, judge_passes


def test_circular_with_two_members_judges_each_side_once() -> None:
    # (i, (i + 1) % 2) for i in 0, 1
    assert comparison_pairs(2, "circular") == [(0, 1), (1, 0)]


def test_circular_pairs_each_member_with_its_successor_and_wraps() -> None:
    assert comparison_pairs(4, "circular") == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_all_pairs_lists_each_unordered_pair_once_in_lexicographic_order() -> None:
    assert comparison_pairs(4, "all_pairs") == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


@pytest.mark.parametrize("strategy", ["circular", "all_pairs"])
@pytest.mark.parametrize("n", [0, 1])
def test_groups_below_two_members_have_no_pairs(n: int, strategy: str) -> None:
    assert comparison_pairs(n, strategy) == []  # type: ignore[arg-type]


def test_unknown_strategy_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown comparison strategy"):
        comparison_pairs(3, "round_robin")  # type: ignore[arg-type]


def test_judge_passes_repeat_all_pairs_per_judge_in_pass_major_order() -> None:
    assert judge_passes(3, "circular", 2) == [
        (0, 1, 0),
        (1, 2, 0),
        (2, 0, 0),
        (0, 1, 1),
        (1, 2, 1),
        (2, 0, 1),
    ]


def test_judge_passes_of_a_singleton_are_empty() -> None:
    assert judge_passes(1, "all_pairs", 3) == []


def test_judge_passes_need_at_least_one_judge() -> None:
    with pytest.raises(ValueError, match="num_judges"):
        judge_passes(3, "circular", 0)
