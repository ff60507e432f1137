"""Verdict parsing: candidate scanning, precedence and validity."""

from __future__ import annotations

import pytest

from genrm_grpc.scoring import Verdict, find_json_objects, parse_verdict


def _triple(text: str) -> tuple[float, float, float] | None:
    verdict = parse_verdict(text)
    return None if verdict is None else (verdict.score_1, verdict.score_2, verdict.ranking)


def test_fenced_json_block_wins_over_a_later_unfenced_object() -> None:
    text = (
        'Draft: {"score_1": 1, "score_2": 1, "ranking": 6}\n'
        '```json\n{"score_1": 4, "score_2": 3, "ranking": 2}\n```\n'
        'Actually {"score_1": 5, "score_2": 5, "ranking": 1}'
    )
    assert _triple(text) == (4.0, 3.0, 2.0)


def test_first_valid_object_inside_a_fenced_block_is_used() -> None:
    text = '```json\n{"note": 1} {"score_1": 2} {"score_1": 5}\n```'
    assert _triple(text) == (2.0, 3.0, 3.5)


def test_fence_tag_is_case_insensitive_and_later_blocks_are_tried() -> None:
    text = '```JSON\n{"nothing": true}\n```\ntext\n```Json {"ranking": 5} ```'
    assert _triple(text) == (3.0, 3.0, 5.0)


def test_without_a_valid_fenced_object_the_last_valid_object_in_the_text_wins() -> None:
    text = (
        '{"score_1": 1, "score_2": 2, "ranking": 5} then '
        '{"score_1": 4, "score_2": 2, "ranking": 2} then {"unrelated": 1} and {broken'
    )
    assert _triple(text) == (4.0, 2.0, 2.0)


def test_an_invalid_fenced_block_falls_back_to_scanning_the_whole_text() -> None:
    # The fallback scan also sees the objects inside the fence.
    text = '```json\n{"verdict": "none"}\n```\n{"score_2": 4}'
    assert _triple(text) == (3.0, 4.0, 3.5)


def test_nested_overall_object_replaces_the_outer_one() -> None:
    text = '{"rubric_evaluations": [], "score_1": 1, "overall": {"score_1": 5, "ranking": 1}}'
    assert _triple(text) == (5.0, 3.0, 1.0)


def test_non_dict_overall_is_ignored() -> None:
    assert _triple('{"overall": 5, "score_1": 2}') == (2.0, 3.0, 3.5)


def test_missing_keys_take_the_given_defaults() -> None:
    verdict = parse_verdict('{"ranking": 6}', default_score=2.5, default_ranking=4.0)
    assert verdict == Verdict(2.5, 2.5, 6.0)


def test_object_without_any_verdict_key_is_not_a_verdict() -> None:
    assert parse_verdict('{"score": 5, "rank": 1}') is None


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e309", '"nan"', '"inf"'])
def test_non_finite_values_make_a_candidate_invalid(value: str) -> None:
    assert parse_verdict('{"score_1": 4, "score_2": ' + value + "}") is None


def test_a_non_finite_last_object_leaves_the_earlier_valid_one_in_force() -> None:
    text = '{"score_1": 4, "score_2": 2, "ranking": 2} {"score_1": NaN}'
    assert _triple(text) == (4.0, 2.0, 2.0)


@pytest.mark.parametrize("value", ["null", "[4]", '{"a": 1}', '"four"'])
def test_values_float_cannot_convert_make_a_candidate_invalid(value: str) -> None:
    assert parse_verdict('{"score_1": ' + value + "}") is None


def test_values_are_converted_with_float_like_the_reference() -> None:
    # float(True) == 1.0 and float(" 4.5 ") == 4.5 are accepted, as float() accepts them.
    assert _triple('{"score_1": true, "score_2": " 4.5 ", "ranking": "2"}') == (1.0, 4.5, 2.0)


def test_unclosed_brace_is_skipped_and_scanning_resumes_inside_it() -> None:
    text = 'prefix {"score_1": 4, {"score_1": 2, "score_2": 5, "ranking": 6} tail'
    assert _triple(text) == (2.0, 5.0, 6.0)


def test_braces_and_escaped_quotes_inside_strings_do_not_count() -> None:
    text = '{"why": "a } brace and a \\" quote {", "score_1": 5, "score_2": 1, "ranking": 1}'
    assert find_json_objects(text) == [text]
    assert _triple(text) == (5.0, 1.0, 1.0)


def test_scanning_resumes_after_each_closed_object() -> None:
    assert find_json_objects('a {"x": {"y": 1}} b {} c {') == ['{"x": {"y": 1}}', "{}"]


def test_malformed_json_between_braces_is_not_a_verdict() -> None:
    assert parse_verdict("{score_1: 4, score_2: 2}") is None
    assert parse_verdict("no json at all") is None
    assert parse_verdict("") is None


def test_an_integer_too_large_for_float_fails_the_whole_text() -> None:
    # float() raises OverflowError here, which the reference does not treat as a merely
    # invalid candidate: its outer handler turns the whole parse into a failure.
    text = '{"score_1": 4, "score_2": 2, "ranking": 2} {"score_1": 1' + "0" * 400 + "}"
    assert parse_verdict(text) is None


def test_parsed_verdicts_are_not_flagged_as_failures() -> None:
    verdict = parse_verdict('{"score_1": 4, "score_2": 2, "ranking": 2}')
    assert verdict is not None and not verdict.parse_failed
