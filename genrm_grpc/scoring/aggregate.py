"""Folding a group's pairwise verdicts into one reward per member.

The default aggregator, ``simple_tiebreaker``, reproduces NeMo Gym's ``genrm_compare``
bit for bit: the sequence of floating-point operations (accumulation order, in-place
updates, when a threshold is taken) is part of the contract, because trainers compare
runs across the two implementations. Keep it that way when editing: reorder nothing,
"simplify" nothing.

Pipeline: verdicts → base score per member (the aggregator) → optional top-percentile
bonuses for the shortest reasoning/answer → optional zero-centred length weights →
optional zero-centred style-density weights → rewards, plus group metrics. The optional
``bradley_terry`` aggregator lives in ``scoring/bradley_terry.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from genrm_grpc.scoring.bradley_terry import RANKING_MIDPOINT, bradley_terry_base_scores
from genrm_grpc.scoring.types import (
    AnswerTexts,
    GroupScores,
    JudgedPair,
    MemberScore,
    ScoringView,
)

__all__ = [
    "RANKING_MIDPOINT",
    "StyleCounts",
    "aggregate",
    "bradley_terry_base_scores",
    "group_relative_weights",
    "simple_tiebreaker_base_scores",
    "style_counts",
    "style_density",
]

# Style counting follows Arena-Hard's markdown features plus emoji. Code blocks are not
# prose styling, so they are cut out before counting (and before measuring length).
_CODE_BLOCK = re.compile(r"```[\s\S]*?```")
_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)
_ORDERED_ITEM = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
_UNORDERED_ITEM = re.compile(r"^\s*[-*+]\s", re.MULTILINE)
_BOLD_STARS = re.compile(r"\*\*[^*\n]+\*\*")
_BOLD_UNDERSCORES = re.compile(r"__[^_\n]+__")
# Each code point in these ranges counts once (a ZWJ sequence counts per code point).
# The U+24C2..U+1F251 range is very wide: it also covers CJK, Hangul and most other
# non-Latin scripts. That is the reference's behaviour and must be kept for parity.
_EMOJI_RANGES = (
    (0x1F600, 0x1F64F),
    (0x1F300, 0x1F5FF),
    (0x1F680, 0x1F6FF),
    (0x1F1E0, 0x1F1FF),
    (0x2702, 0x27B0),
    (0x24C2, 0x1F251),
    (0x1F900, 0x1F9FF),
    (0x1FA00, 0x1FA6F),
    (0x1FA70, 0x1FAFF),
    (0x2600, 0x26FF),
    (0x2700, 0x27BF),
)
_EMOJI = re.compile("[" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in _EMOJI_RANGES) + "]")


class StyleCounts(NamedTuple):
    """Markdown/emoji features of one text, code blocks excluded."""

    headers: int
    list_items: int
    bold: int
    emoji: int

    @property
    def total(self) -> int:
        """All style elements together."""
        return self.headers + self.list_items + self.bold + self.emoji


def style_counts(text: str) -> StyleCounts:
    """Count headers (``#``..``######`` then whitespace, at a line start), list items
    (``1.`` or ``-``/``*``/``+`` then whitespace, after optional indentation), bold runs
    (``**x**`` / ``__x__`` within one line) and emoji code points, outside code blocks.

    The list patterns start with ``^\\s*``, which can run across blank lines; that is
    intentional (it is how the reference counts).
    """
    prose = _CODE_BLOCK.sub("", text)
    return StyleCounts(
        headers=len(_HEADER.findall(prose)),
        list_items=len(_ORDERED_ITEM.findall(prose)) + len(_UNORDERED_ITEM.findall(prose)),
        bold=len(_BOLD_STARS.findall(prose)) + len(_BOLD_UNDERSCORES.findall(prose)),
        emoji=len(_EMOJI.findall(prose)),
    )


def style_density(text: str) -> float:
    """Style elements per character of prose: ``style_counts(...).total / len(prose)``.

    ``prose`` is ``text`` with code blocks removed, stripped of surrounding whitespace;
    an empty prose has density 0. The counts come from :func:`style_counts` applied to
    the already code-free text, so code-block removal runs twice, as in the reference
    (a second pass has not been seen to change anything, but parity is cheap to keep).
    """
    without_code = _CODE_BLOCK.sub("", text)
    length = len(without_code.strip())
    if length <= 0:
        return 0.0
    return style_counts(without_code).total / length


def group_relative_weights(values: Sequence[float]) -> list[float]:
    """Zero-centred weights that favour the smallest values of a group.

    Each value maps linearly onto ``1`` (the group minimum) .. ``0`` (the maximum), then
    the group mean is subtracted, so the weights sum to (about) zero and only relative
    differences inside the group matter. If all values are equal every weight is 0.
    """
    largest, smallest = max(values), min(values)
    if largest == smallest:
        return [0.0] * len(values)
    span = largest - smallest
    raw = [1.0 - ((value - smallest) / span) for value in values]
    mean = sum(raw) / len(raw)
    return [weight - mean for weight in raw]


def simple_tiebreaker_base_scores(
    size: int, judged: Sequence[JudgedPair], default_score: float
) -> list[float]:
    """Each member's mean score over the verdicts it appears in, ties broken by ranking.

    When a verdict's two scores are equal, ``adjust = 3.5 - ranking`` moves them apart
    (added to the first, subtracted from the second), so a tie with ranking 2 becomes a
    1.5-point lead for the first answer. A member that appears in no verdict gets
    ``default_score``.
    """
    totals = [0.0] * size
    counts = [0] * size
    for pair in judged:
        first, second = pair.verdict.score_1, pair.verdict.score_2
        if first == second:
            adjust = RANKING_MIDPOINT - pair.verdict.ranking
            first = first + adjust
            second = second - adjust
        totals[pair.response_i] += first
        totals[pair.response_j] += second
        counts[pair.response_i] += 1
        counts[pair.response_j] += 1
    return [totals[k] / counts[k] if counts[k] > 0 else default_score for k in range(size)]


def _numpy_sum(values: Sequence[float]) -> float:
    """Sum the way ``numpy.add.reduce`` does on a contiguous float64 array.

    The reference reports mean/std through numpy, whose pairwise summation rounds
    differently from a running sum; this reproduces it so the metrics match exactly.
    """

    def pairwise(start: int, count: int) -> float:
        if count < 8:
            total = -0.0
            for k in range(start, start + count):
                total += values[k]
            return total
        if count <= 128:
            lanes = [values[start + lane] for lane in range(8)]
            offset = 8
            while offset < count - (count % 8):
                for lane in range(8):
                    lanes[lane] += values[start + offset + lane]
                offset += 8
            total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
                (lanes[4] + lanes[5]) + (lanes[6] + lanes[7])
            )
            for k in range(start + offset, start + count):
                total += values[k]
            return total
        half = count // 2
        half -= half % 8
        return pairwise(start, half) + pairwise(start + half, count - half)

    return 0.0 + pairwise(0, len(values))


def _mean_and_population_std(values: Sequence[float]) -> tuple[float, float]:
    mean = _numpy_sum(values) / len(values)
    squared = [(value - mean) * (value - mean) for value in values]
    return mean, math.sqrt(_numpy_sum(squared) / len(values))


def _apply_length_adjustments(
    scores: list[float],
    adjustments: list[float],
    texts: Sequence[AnswerTexts],
    params: ScoringView,
) -> None:
    size = len(texts)
    reasoning_lengths = [len(text.reasoning.strip()) for text in texts]
    answer_lengths = [len(text.answer.strip()) for text in texts]

    # The bar is taken once, from the scores before any bonus is granted.
    rank = max(0, int(size * params.top_percentile) - 1)
    if rank >= size:
        raise ValueError(
            f"top_percentile={params.top_percentile} selects rank {rank} in a group of {size}"
        )
    bar = sorted(scores, reverse=True)[rank]

    for bonus, lengths in (
        (params.reasoning_bonus, reasoning_lengths),
        (params.answer_bonus, answer_lengths),
    ):
        if bonus <= 0:
            continue
        candidates = [k for k in range(size) if lengths[k] > 0]
        if not candidates:
            continue
        # min() keeps the first of equally short members; compared with the *current*
        # score, so the reasoning bonus can lift a member over the bar for the answer one.
        shortest = min(candidates, key=lambda k: lengths[k])
        if scores[shortest] >= bar:
            scores[shortest] += bonus
            adjustments[shortest] += bonus

    reasoning_coeff = params.group_reasoning_length_penalty_coeff
    answer_coeff = params.group_answer_length_penalty_coeff
    if reasoning_coeff > 0 or answer_coeff > 0:
        reasoning_weights = group_relative_weights(reasoning_lengths)
        answer_weights = group_relative_weights(answer_lengths)
        for k in range(size):
            shift = reasoning_weights[k] * reasoning_coeff + answer_weights[k] * answer_coeff
            if shift != 0:
                scores[k] += shift
                adjustments[k] += shift


def _apply_style_adjustments(
    scores: list[float],
    adjustments: list[float],
    texts: Sequence[AnswerTexts],
    coeff: float,
) -> None:
    weights = group_relative_weights([style_density(text.answer) for text in texts])
    for k, weight in enumerate(weights):
        shift = weight * coeff
        if shift != 0:
            scores[k] += shift
            adjustments[k] += shift


def _apply_adjustments(
    scores: list[float],
    adjustments: list[float],
    texts: Sequence[AnswerTexts],
    params: ScoringView,
) -> None:
    """The length bonuses and weights, then the style weights, each only when configured."""
    if (
        params.reasoning_bonus > 0
        or params.answer_bonus > 0
        or params.group_reasoning_length_penalty_coeff > 0
        or params.group_answer_length_penalty_coeff > 0
    ):
        _apply_length_adjustments(scores, adjustments, texts, params)
    if params.group_style_penalty_coeff > 0:
        _apply_style_adjustments(scores, adjustments, texts, params.group_style_penalty_coeff)


def _base_scores(scored: int, judged: Sequence[JudgedPair], params: ScoringView) -> list[float]:
    """The aggregator's base score of each of the ``scored`` indices."""
    if params.aggregator_method == "simple_tiebreaker":
        return simple_tiebreaker_base_scores(scored, judged, params.default_score)
    if params.aggregator_method == "bradley_terry":
        return bradley_terry_base_scores(scored, judged, params.default_score)
    raise ValueError(f"unknown aggregator method {params.aggregator_method!r}")


def _group_metrics(judged: Sequence[JudgedPair]) -> dict[str, float]:
    """The group metrics of ``aggregate`` (its docstring says which and when)."""
    metrics: dict[str, float] = {}
    if judged:
        individual = [s for pair in judged for s in (pair.verdict.score_1, pair.verdict.score_2)]
        mean, std = _mean_and_population_std(individual)
        ties = sum(1 for pair in judged if pair.verdict.score_1 == pair.verdict.score_2)
        metrics["mean_individual_score"] = mean
        metrics["std_individual_score"] = std
        metrics["tiebreak_usage_rate"] = ties / len(judged)
    failures = sum(1 for pair in judged if pair.verdict.parse_failed)
    metrics["genrm_parse_failure_rate_per_group"] = failures / max(1, len(judged))
    return metrics


def aggregate(
    texts: Sequence[AnswerTexts],
    judged: Sequence[JudgedPair],
    params: ScoringView,
    *,
    baseline: AnswerTexts | None = None,
) -> GroupScores:
    """Rewards for a group of ``len(texts)`` members from its judged pairs.

    ``judged`` must be in aggregation order (see :func:`~genrm_grpc.scoring.pairs.judge_passes`);
    a parse-failed verdict carries the default scores and counts like any other.

    After the aggregator's base scores, with at least two members:

    * if any of ``reasoning_bonus``, ``answer_bonus`` or the two length coefficients is
      positive: the bonus bar is the score at position ``max(0, int(N * top_percentile) - 1)``
      of the base scores sorted high to low; the first member with the shortest
      non-empty stripped reasoning gets ``reasoning_bonus`` if its score reaches the bar,
      then likewise for answers with ``answer_bonus``; then every member gets
      ``w_reasoning * reasoning_coeff + w_answer * answer_coeff`` with ``w`` from
      :func:`group_relative_weights` of the stripped lengths (shorter is better);
    * if ``group_style_penalty_coeff`` is positive: ``w * coeff`` with ``w`` from
      :func:`group_relative_weights` of :func:`style_density` of the answers.

    Metrics: ``mean_individual_score`` and ``std_individual_score`` (population) over
    both raw scores of every verdict and ``tiebreak_usage_rate`` (share of verdicts with
    equal scores), present only when there is at least one verdict; and always
    ``genrm_parse_failure_rate_per_group`` = parse-failed verdicts / verdicts (0.0 when
    there are none).
    """
    size = len(texts)
    # fixed_baseline mode: the baseline is index ``size`` in the verdicts. It takes part
    # in the base scores only; bonuses, penalties and rewards are for the members alone.
    scored = size + 1 if baseline is not None else size
    for pair in judged:
        if not (0 <= pair.response_i < scored and 0 <= pair.response_j < scored):
            raise ValueError(
                f"pair ({pair.response_i}, {pair.response_j}) is outside a group of {size}"
            )

    base = _base_scores(scored, judged, params)[:size]
    scores = list(base)
    adjustments = [0.0] * size
    if size >= 2:
        _apply_adjustments(scores, adjustments, texts, params)

    metrics = _group_metrics(judged)
    members = tuple(
        MemberScore(
            reward=scores[k],
            score_raw=base[k],
            overall_score=scores[k],
            length_adjustment=adjustments[k],
        )
        for k in range(size)
    )
    return GroupScores(members=members, metrics=metrics)
