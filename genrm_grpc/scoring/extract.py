"""Pulling the reasoning and the final answer out of a Responses-API output object.

Members arrive as loosely typed JSON; anything that does not have the expected shape is
ignored rather than rejected, so one odd item never costs a member its reward.
"""

from __future__ import annotations

from genrm_grpc.scoring.types import AnswerTexts

__all__ = ["extract_texts"]


def extract_texts(responses_api_obj: object) -> AnswerTexts:
    """Concatenate the reasoning summaries and the ``output_text`` parts of a response.

    ``reasoning`` joins ``summary[*].text`` of every ``output`` item whose ``type`` is
    ``"reasoning"``; ``answer`` joins ``content[*].text`` of the parts typed
    ``"output_text"`` inside items typed ``"message"``. Both keep document order. Items
    or parts that are not dicts, fields that are missing or not lists, and texts that are
    not strings are skipped.
    """
    reasoning: list[str] = []
    answer: list[str] = []
    if not isinstance(responses_api_obj, dict):
        return AnswerTexts("", "")
    output = responses_api_obj.get("output", [])
    if not isinstance(output, list):
        return AnswerTexts("", "")
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "")
        if kind == "reasoning":
            summary = item.get("summary", [])
            if isinstance(summary, list):
                reasoning.extend(
                    part["text"]
                    for part in summary
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
        elif kind == "message":
            content = item.get("content", [])
            if isinstance(content, list):
                answer.extend(
                    part["text"]
                    for part in content
                    if isinstance(part, dict)
                    and part.get("type") == "output_text"
                    and isinstance(part.get("text"), str)
                )
    return AnswerTexts("".join(reasoning), "".join(answer))
