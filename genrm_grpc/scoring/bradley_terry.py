"""The optional ``bradley_terry`` aggregator: base scores from a Bradley–Terry fit.

Not NeMo Gym's behaviour (``simple_tiebreaker`` in ``scoring/aggregate.py`` is); see
``bradley_terry_base_scores`` for the model, the reward transform and when to prefer it.
The fit is deterministic: a fixed sequence of floating-point operations, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from genrm_grpc.scoring.types import JudgedPair

#: Rankings run 1..6; below the midpoint the first answer is preferred, above it the second.
RANKING_MIDPOINT = 3.5

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


def _newton_step(
    size: int,
    theta: Sequence[float],
    wins: Sequence[float],
    games: Sequence[tuple[int, int, float]],
) -> list[float]:
    """The full Newton step from ``theta``: the (ridged) curvature solved against the
    gradient of the log-likelihood with the prior game."""
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
    return _solve_positive_definite(curvature, gradient)


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
        step = _newton_step(size, theta, wins, games)
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


def _weighted_games(
    size: int, judged: Sequence[JudgedPair]
) -> tuple[list[float], dict[tuple[int, int], float], list[bool]]:
    """Each member's weighted wins (prior included), the summed weight of the games of
    each pair ``(low, high)``, and which members took part in a counted verdict."""
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
    return wins, weights, played


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
    wins, weights, played = _weighted_games(size, judged)
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
