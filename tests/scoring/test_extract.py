"""Reasoning/answer extraction from Responses-API objects."""

from __future__ import annotations

from typing import Any

from genrm_grpc.scoring import AnswerTexts, extract_texts


def _message(*parts: Any) -> dict[str, Any]:
    return {"type": "message", "content": list(parts)}


def _text(text: Any, kind: str = "output_text") -> dict[str, Any]:
    return {"type": kind, "text": text}


def test_reasoning_summaries_and_output_text_are_concatenated_in_order() -> None:
    obj = {
        "output": [
            {"type": "reasoning", "summary": [{"text": "Let me "}, {"text": "think."}]},
            _message(_text("Par"), _text("is")),
            {"type": "reasoning", "summary": [{"text": " Again."}]},
            _message(_text("!")),
        ]
    }
    assert extract_texts(obj) == AnswerTexts("Let me think. Again.", "Paris!")


def test_only_output_text_parts_of_message_items_count_as_answer() -> None:
    obj = {
        "output": [
            _message(_text("kept"), _text("refused", kind="refusal"), {"text": "untyped"}),
            {"type": "function_call", "content": [_text("not a message")]},
        ]
    }
    assert extract_texts(obj).answer == "kept"


def test_malformed_items_and_fields_are_skipped() -> None:
    obj = {
        "output": [
            "not a dict",
            None,
            {"type": "reasoning"},  # no summary
            {"type": "reasoning", "summary": "not a list"},
            {"type": "reasoning", "summary": ["x", {"text": 5}, {"no_text": 1}, {"text": "ok"}]},
            {"type": "message"},  # no content
            {"type": "message", "content": {"text": "not a list"}},
            _message("bare string", _text(None), _text(["x"]), _text("answer")),
            {"no_type": True, "content": [_text("ignored")]},
        ]
    }
    assert extract_texts(obj) == AnswerTexts("ok", "answer")


def test_non_dict_object_or_non_list_output_gives_empty_texts() -> None:
    assert extract_texts(None) == AnswerTexts("", "")
    assert extract_texts(["output"]) == AnswerTexts("", "")
    assert extract_texts({"output": "text"}) == AnswerTexts("", "")
    assert extract_texts({}) == AnswerTexts("", "")


def test_judge_sees_literal_none_for_a_blank_answer() -> None:
    assert extract_texts({"output": [_message(_text("  \n"))]}).judge_text() == "None"
    assert extract_texts({"output": [_message(_text(" hi "))]}).judge_text() == " hi "
