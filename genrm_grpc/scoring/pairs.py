"""Which ordered pairs of group members the judge compares, and in what order.

The order matters: verdicts are folded into rewards in exactly the order produced here
(judge pass first, then pair), and floating-point accumulation is order-sensitive.
"""

from __future__ import annotations

from genrm_grpc.scoring.types import ComparisonStrategy

__all__ = ["comparison_pairs", "judge_passes"]


def comparison_pairs(n: int, strategy: ComparisonStrategy) -> list[tuple[int, int]]:
    """The ordered ``(first, second)`` member pairs for a group of ``n`` members.

    ``circular`` pairs each member with its successor, wrapping around (``n`` pairs; for
    ``n == 2`` that is ``(0, 1), (1, 0)``, so each member is judged once on each side).
    ``all_pairs`` yields every unordered pair once with ``first < second``, in
    lexicographic order (``n * (n - 1) / 2`` pairs). A group of fewer than two members
    has nothing to compare and gets no pairs.
    """
    if strategy not in ("circular", "all_pairs"):
        raise ValueError(f"unknown comparison strategy {strategy!r}")
    if n < 2:
        return []
    if strategy == "circular":
        return [(i, (i + 1) % n) for i in range(n)]
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def judge_passes(
    n: int, strategy: ComparisonStrategy, num_judges: int
) -> list[tuple[int, int, int]]:
    """Every judge call of a group as ``(first, second, judge_index)``, in aggregation order.

    Each pass re-judges all pairs; passes are listed one after another, so the pair
    order repeats ``num_judges`` times.
    """
    if num_judges < 1:
        raise ValueError(f"num_judges must be >= 1, got {num_judges}")
    pairs = comparison_pairs(n, strategy)
    return [(i, j, judge) for judge in range(num_judges) for i, j in pairs]
