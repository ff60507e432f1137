"""Property tests: symmetry, dominance, zero-centring and finiteness of rewards."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_grpc.config import Settings
from genrm_grpc.scoring import (
    AnswerTexts,
    JudgedPair,
    Verdict,
    aggregate,
    judge_passes,
    parse_verdict,
)

_SCORE_VALUES = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]
_SCORES = st.sampled_from(_SCORE_VALUES)
_RANKINGS = st.sampled_from([1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0])
_STRATEGIES = st.sampled_from(["circular", "all_pairs"])
_AGGREGATORS = st.sampled_from(["simple_tiebreaker", "bradley_terry"])
_TEXT = st.text(
    alphabet=st.sampled_from(["a", " ", "\n", "#", "-", "*", "1", ".", "_", "`", "😀", "中"]),
    max_size=40,
)
_EXAMPLES = settings(max_examples=150, deadline=None)


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[AnswerTexts], list[JudgedPair], str, int]:
    size = draw(st.integers(min_value=2, max_value=7))
    strategy = draw(_STRATEGIES)
    num_judges = draw(st.integers(min_value=1, max_value=2))
    texts = [AnswerTexts(draw(_TEXT), draw(_TEXT)) for _ in range(size)]
    judged = [
        JudgedPair(
            i, j, k, Verdict(draw(_SCORES), draw(_SCORES), draw(_RANKINGS), draw(st.booleans()))
        )
        for i, j, k in judge_passes(size, strategy, num_judges)  # type: ignore[arg-type]
    ]
    return texts, judged, strategy, num_judges


@_EXAMPLES
@given(group=_groups(), data=st.data(), method=_AGGREGATORS)
def test_permuting_members_permutes_rewards_when_bonuses_are_off(
    group: tuple[list[AnswerTexts], list[JudgedPair], str, int], data: st.DataObject, method: str
) -> None:
    texts, judged, _, _ = group
    size = len(texts)
    where = data.draw(st.permutations(range(size)))  # member k moves to slot where[k]
    moved_texts = [texts[0]] * size
    for k in range(size):
        moved_texts[where[k]] = texts[k]
    moved_judged = [
        JudgedPair(where[p.response_i], where[p.response_j], p.judge_index, p.verdict)
        for p in judged
    ]
    params = Settings(aggregator_method=method)  # type: ignore[arg-type]
    before = aggregate(texts, judged, params)
    after = aggregate(moved_texts, moved_judged, params)
    for k in range(size):
        assert math.isclose(after.members[where[k]].reward, before.members[k].reward, abs_tol=1e-9)
    assert after.metrics == before.metrics


@_EXAMPLES
@given(
    size=st.integers(min_value=2, max_value=7),
    strategy=_STRATEGIES,
    data=st.data(),
    method=_AGGREGATORS,
)
def test_member_winning_every_pair_five_to_one_ranks_first(
    size: int, strategy: str, data: st.DataObject, method: str
) -> None:
    winner = data.draw(st.integers(min_value=0, max_value=size - 1))
    judged = []
    for i, j, k in judge_passes(size, strategy, 1):  # type: ignore[arg-type]
        if i == winner:
            verdict = Verdict(5.0, 1.0, 1.0)
        elif j == winner:
            verdict = Verdict(1.0, 5.0, 6.0)
        else:  # a decisive verdict between two other members
            first = data.draw(_SCORES)
            second = data.draw(st.sampled_from([s for s in _SCORE_VALUES if s != first]))
            verdict = Verdict(first, second, 1.0 if first > second else 6.0)
        judged.append(JudgedPair(i, j, k, verdict))
    params = Settings(aggregator_method=method)  # type: ignore[arg-type]
    rewards = [m.reward for m in aggregate([AnswerTexts("", "")] * size, judged, params).members]
    others = [r for k, r in enumerate(rewards) if k != winner]
    if strategy == "all_pairs":
        # The winner met everyone; each other member lost to it at least once.
        assert all(rewards[winner] > r for r in others)
    elif method == "simple_tiebreaker":
        # In a circle a member two steps away never meets the winner and may tie it.
        # (Bradley–Terry is exempt here: beating a strong neighbour can legitimately be
        # worth more than beating two weak ones when the winner's opponents are weak.)
        assert all(rewards[winner] >= r for r in others)


@_EXAMPLES
@given(
    group=_groups(),
    reasoning_coeff=st.floats(min_value=0.0, max_value=2.0),
    answer_coeff=st.floats(min_value=0.0, max_value=2.0),
    style_coeff=st.floats(min_value=0.0, max_value=2.0),
    method=_AGGREGATORS,
)
def test_length_and_style_adjustments_sum_to_zero_without_bonuses(
    group: tuple[list[AnswerTexts], list[JudgedPair], str, int],
    reasoning_coeff: float,
    answer_coeff: float,
    style_coeff: float,
    method: str,
) -> None:
    texts, judged, _, _ = group
    params = Settings(
        aggregator_method=method,  # type: ignore[arg-type]
        group_reasoning_length_penalty_coeff=reasoning_coeff,
        group_answer_length_penalty_coeff=answer_coeff,
        group_style_penalty_coeff=style_coeff,
    )
    members = aggregate(texts, judged, params).members
    assert math.isclose(sum(m.length_adjustment for m in members), 0.0, abs_tol=1e-9)
    for member in members:
        assert math.isclose(
            member.reward, member.score_raw + member.length_adjustment, abs_tol=1e-12
        )


@_EXAMPLES
@given(
    group=_groups(),
    method=_AGGREGATORS,
    bonus=st.floats(min_value=0.0, max_value=3.0),
    coeff=st.floats(min_value=0.0, max_value=3.0),
    top_percentile=st.floats(min_value=0.0, max_value=1.0),
)
def test_rewards_are_finite_and_one_per_member(
    group: tuple[list[AnswerTexts], list[JudgedPair], str, int],
    method: str,
    bonus: float,
    coeff: float,
    top_percentile: float,
) -> None:
    texts, judged, strategy, num_judges = group
    # Unvalidated on purpose: aggregate must stay finite even at top_percentile=0, which
    # Settings itself refuses.
    params = Settings.model_construct(
        comparison_strategy=strategy,  # type: ignore[arg-type]
        num_judges_per_comparison=num_judges,
        aggregator_method=method,  # type: ignore[arg-type]
        reasoning_bonus=bonus,
        answer_bonus=bonus / 2,
        top_percentile=top_percentile,
        group_reasoning_length_penalty_coeff=coeff,
        group_answer_length_penalty_coeff=coeff / 3,
        group_style_penalty_coeff=coeff,
    )
    scores = aggregate(texts, judged, params)
    assert len(scores.members) == len(texts)
    assert all(math.isfinite(m.reward) for m in scores.members)
    assert all(math.isfinite(v) for v in scores.metrics.values())
    assert 0.0 <= scores.metrics["genrm_parse_failure_rate_per_group"] <= 1.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('{}[]":,\\ 0123456789abnNs_`json\n')), max_size=60))
def test_parse_verdict_never_raises_and_returns_finite_values(text: str) -> None:
    verdict = parse_verdict(text)
    if verdict is not None:
        assert all(math.isfinite(v) for v in (verdict.score_1, verdict.score_2, verdict.ranking))


@_EXAMPLES
@given(
    score_1=st.floats(allow_nan=False, allow_infinity=False),
    score_2=st.floats(allow_nan=False, allow_infinity=False),
    ranking=st.floats(allow_nan=False, allow_infinity=False),
    prose=st.text(alphabet=st.sampled_from(list("ab .\n")), max_size=20),
)
def test_a_dumped_verdict_round_trips_through_surrounding_prose(
    score_1: float, score_2: float, ranking: float, prose: str
) -> None:
    blob = json.dumps({"score_1": score_1, "score_2": score_2, "ranking": ranking})
    assert parse_verdict(prose + blob + prose) == Verdict(score_1, score_2, ranking)
