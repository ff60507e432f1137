"""Folding a group's pairwise verdicts into one reward per member.

The default aggregator, ``simple_tiebreaker``, reproduces NeMo Gym's ``genrm_compare``
bit for bit: the sequence of floating-point operations (accumulation order, in-place
updates, when a threshold is taken) is part of the contract, because trainers compare
runs across the two implementations. Keep it that way when editing: reorder nothing,
"simplify" nothing.

Pipeline: verdicts → base score per member (the aggregator) → optional top-percentile
bonuses for the shortest reasoning/answer → optional zero-centred length weights →
optional zero-centred style-density weights → rewards, plus group metrics.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

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

#: Rankings run 1..6; below the midpoint the first answer is preferred, above it the second.
RANKING_MIDPOINT = 3.5

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


# Bradley–Terry settings. A tie weighs as much as the narrowest decisive verdict on the
# 1..6 ranking scale; the prior is one virtual drawn game against a fixed opponent of
# log-strength 0, which keeps an undefeated member's strength finite.
_BT_TIE_WEIGHT = 0.5
_BT_PRIOR_WEIGHT = 1.0
_BT_MAX_ITERATIONS = 100
_BT_TOLERANCE = 1e-12
_BT_RANGE = 4.0
_BT_MAX_STEP = 2.0  # in log-strength units per Newton iteration
_BT_RIDGE = 1e-9
_BT_LOCAL_STEP = 1e-3


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _softplus(x: float) -> float:
    """``log(1 + e**x)`` without overflow."""
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def _solve_positive_definite(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Solve ``matrix @ x = rhs`` for a symmetric positive-definite matrix (Cholesky)."""
    size = len(rhs)
    lower = [[0.0] * size for _ in range(size)]
    for row in range(size):
        for col in range(row + 1):
            acc = matrix[row][col] - sum(lower[row][k] * lower[col][k] for k in range(col))
            lower[row][col] = math.sqrt(acc) if row == col else acc / lower[col][col]
    forward = [0.0] * size
    for row in range(size):
        head = sum(lower[row][k] * forward[k] for k in range(row))
        forward[row] = (rhs[row] - head) / lower[row][row]
    solution = [0.0] * size
    for row in reversed(range(size)):
        tail = sum(lower[k][row] * solution[k] for k in range(row + 1, size))
        solution[row] = (forward[row] - tail) / lower[row][row]
    return solution


def _fit_log_strengths(
    size: int, wins: Sequence[float], games: Sequence[tuple[int, int, float]]
) -> list[float]:
    """Maximum a-posteriori Bradley–Terry log-strengths by damped Newton steps.

    The log-likelihood (with the prior game) is strictly concave in the log-strengths,
    so Newton's method with capped steps and step halving converges to the unique
    optimum, quadratically near it; about a dozen iterations suffice even for a perfectly
    ordered group, where a plain minorise–maximise iteration would crawl.
    """

    def log_likelihood(theta: Sequence[float]) -> float:
        total = 0.0
        for k in range(size):
            total += wins[k] * theta[k] - _BT_PRIOR_WEIGHT * _softplus(theta[k])
        for i, j, weight in games:
            total -= weight * (theta[j] + _softplus(theta[i] - theta[j]))
        return total

    theta = [0.0] * size
    current = log_likelihood(theta)
    for _ in range(_BT_MAX_ITERATIONS):
        gradient = list(wins)
        curvature = [[0.0] * size for _ in range(size)]
        for k in range(size):
            p = _sigmoid(theta[k])
            gradient[k] -= _BT_PRIOR_WEIGHT * p
            curvature[k][k] += _BT_PRIOR_WEIGHT * p * (1.0 - p)
        for i, j, weight in games:
            p = _sigmoid(theta[i] - theta[j])
            gradient[i] -= weight * p
            gradient[j] -= weight * (1.0 - p)
            bend = weight * p * (1.0 - p)
            curvature[i][i] += bend
            curvature[j][j] += bend
            curvature[i][j] -= bend
            curvature[j][i] -= bend
        for k in range(size):
            curvature[k][k] += _BT_RIDGE
        step = _solve_positive_definite(curvature, gradient)
        longest = max(abs(d) for d in step)
        if longest < _BT_TOLERANCE:
            break
        if longest <= _BT_LOCAL_STEP:
            # Close to the optimum Newton converges on its own; comparing likelihoods
            # here would only measure rounding noise and stall the last digits.
            theta = [t + d for t, d in zip(theta, step, strict=True)]
            current = log_likelihood(theta)
            continue
        # Far from the optimum the curvature can be tiny and a full step huge; capping it
        # keeps every iterate where sigmoid still has curvature, and halving it until the
        # likelihood does not drop keeps the iteration monotone.
        scale = min(1.0, _BT_MAX_STEP / longest)
        while True:
            candidate = [t + scale * d for t, d in zip(theta, step, strict=True)]
            value = log_likelihood(candidate)
            if value >= current or scale < 1e-6:
                break
            scale /= 2.0
        theta, current = candidate, value
    return theta


def bradley_terry_base_scores(
    size: int, judged: Sequence[JudgedPair], default_score: float
) -> list[float]:
    """Base scores from a Bradley–Terry fit of the judge's preferences (optional aggregator).

    Only the ranking is used. A verdict with ``ranking < 3.5`` is a win for the first
    answer and ``> 3.5`` for the second, weighted by the margin ``|ranking - 3.5|``; an
    exact 3.5 is a drawn game of weight 0.5 (half a win each). Verdicts flagged as parse
    failures carry no preference and are ignored. Log-strengths ``theta`` maximise the
    weighted Bradley–Terry likelihood ``P(k beats l) = sigmoid(theta_k - theta_l)`` plus
    one virtual drawn game per member against a fixed opponent with ``theta = 0`` (a
    prior that keeps an undefeated member finite); the fit is deterministic (damped
    Newton, fixed tolerances, no randomness).

    Rewards: ``default_score + 4 * (P_k - 1/2)``, where ``P_k`` is member ``k``'s fitted
    probability of beating another member, averaged over the other members that took
    part in at least one counted verdict. ``P_k`` grows with strength (so the transform
    is monotone), the rewards stay inside ``default_score ± 2`` (1..5 with the usual
    default of 3) and average exactly ``default_score``; unlike a squashed log-strength
    it does not flatten the top of a clearly ordered group. Members without a counted
    verdict get ``default_score``.

    When to prefer it over ``simple_tiebreaker``: with ``all_pairs`` (or several judge
    passes) it uses the whole comparison graph, so beating a strong answer is worth more
    than beating a weak one, and it ignores the judge's absolute score level, which is
    where per-position bias (a judge favouring whichever answer comes first) and score
    drift mostly live. With ``circular`` and one pass each member has only two games and
    the fit adds little. It is not NeMo Gym's behaviour, so rewards are not comparable
    with runs trained on ``genrm_compare``.
    """
    wins = [0.5 * _BT_PRIOR_WEIGHT] * size
    weights: dict[tuple[int, int], float] = {}
    played = [False] * size
    for pair in judged:
        if pair.verdict.parse_failed:
            continue
        i, j = pair.response_i, pair.response_j
        if i == j:
            continue
        ranking = pair.verdict.ranking
        if ranking < RANKING_MIDPOINT:
            weight, first_share = RANKING_MIDPOINT - ranking, 1.0
        elif ranking > RANKING_MIDPOINT:
            weight, first_share = ranking - RANKING_MIDPOINT, 0.0
        else:
            weight, first_share = _BT_TIE_WEIGHT, 0.5
        wins[i] += weight * first_share
        wins[j] += weight * (1.0 - first_share)
        key = (min(i, j), max(i, j))
        weights[key] = weights.get(key, 0.0) + weight
        played[i] = played[j] = True

    active = [k for k in range(size) if played[k]]
    if len(active) < 2:
        return [default_score] * size
    games = [(i, j, weight) for (i, j), weight in sorted(weights.items())]
    theta = _fit_log_strengths(size, wins, games)
    scores = [default_score] * size
    for k in active:
        win_share = sum(_sigmoid(theta[k] - theta[other]) for other in active if other != k) / (
            len(active) - 1
        )
        scores[k] = default_score + _BT_RANGE * (win_share - 0.5)
    return scores


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

    if params.aggregator_method == "simple_tiebreaker":
        base = simple_tiebreaker_base_scores(scored, judged, params.default_score)[:size]
    elif params.aggregator_method == "bradley_terry":
        base = bradley_terry_base_scores(scored, judged, params.default_score)[:size]
    else:
        raise ValueError(f"unknown aggregator method {params.aggregator_method!r}")

    scores = list(base)
    adjustments = [0.0] * size
    if size >= 2:
        if (
            params.reasoning_bonus > 0
            or params.answer_bonus > 0
            or params.group_reasoning_length_penalty_coeff > 0
            or params.group_answer_length_penalty_coeff > 0
        ):
            _apply_length_adjustments(scores, adjustments, texts, params)
        if params.group_style_penalty_coeff > 0:
            _apply_style_adjustments(scores, adjustments, texts, params.group_style_penalty_coeff)

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
