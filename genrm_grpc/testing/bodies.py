"""The fake judge's wire bodies: reading a judge request, writing an answer or an error.

Pure functions of the request and the fake judge's state (``genrm_grpc.testing.server``
serves them over HTTP, streamed or not). Both wire formats are read and written, as
described in the server's docstring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from genrm_grpc.testing.faults import (
    MALFORMED_TEXT,
    PARTIAL_TEXT,
    FakeJudgeConfig,
    JudgeRequest,
    adversarial_text,
)
from genrm_grpc.testing.heuristic import REASONING_SUMMARY, verdict_text, words
from genrm_grpc.testing.node import Plan


class BadRequest(Exception):
    pass


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


@dataclass
class _Read:
    """What one wire format's request says, before the checks both formats share."""

    conversation: list[tuple[str, str]] = field(default_factory=list)
    ordered: list[tuple[str, str]] = field(default_factory=list)
    roles: tuple[str, ...] = ()
    principle: str | None = None
    response_1: object = None
    response_2: object = None
    max_tokens: object = None


def _read_responses(body: dict[str, Any]) -> _Read:
    """``/v1/responses``: the conversation in ``input``, the pair in ``metadata``."""
    read = _Read()
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        read.conversation.append(("user", raw_input))
    elif isinstance(raw_input, list):
        for item in raw_input:
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                read.conversation.append((item["role"], _text_of(item.get("content"))))
    else:
        raise BadRequest("'input' must be a string or a list of messages")
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        raise BadRequest("'metadata' with response_1 and response_2 is required")
    read.response_1 = metadata.get("response_1")
    read.response_2 = metadata.get("response_2")
    raw_principle = metadata.get("principle")
    read.principle = raw_principle if isinstance(raw_principle, str) else None
    read.roles = tuple(role for role, _ in read.conversation)
    read.max_tokens = body.get("max_output_tokens")
    read.ordered = [
        *read.conversation,
        *([("principle", read.principle)] if read.principle is not None else []),
        *(
            (role, value)
            for role, value in (("response_1", read.response_1), ("response_2", read.response_2))
            if isinstance(value, str)
        ),
    ]
    return read


def _read_chat(body: dict[str, Any]) -> _Read:
    """``/v1/chat/completions``: the pair and the principle are messages with their roles."""
    read = _Read()
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be a list")
    for item in messages:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise BadRequest("every message needs a string 'role'")
        role, text = item["role"], _text_of(item.get("content"))
        read.ordered.append((role, text))
        if role == "response_1":
            read.response_1 = text
        elif role == "response_2":
            read.response_2 = text
        elif role == "principle":
            read.principle = text
        else:
            read.conversation.append((role, text))
    read.roles = tuple(role for role, _ in read.ordered)
    read.max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    return read


def parse_judge_request(endpoint: str, body: object) -> JudgeRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    read = _read_responses(body) if endpoint == "responses" else _read_chat(body)
    response_1, response_2 = read.response_1, read.response_2
    if not isinstance(response_1, str) or not isinstance(response_2, str):
        raise BadRequest("both response_1 and response_2 are required")
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    conversation = read.conversation
    last_user = next((text for role, text in reversed(conversation) if role == "user"), "")
    all_text = " ".join([*(text for _, text in conversation), response_1, response_2])
    max_tokens = read.max_tokens
    return JudgeRequest(
        endpoint=endpoint,
        model=model if isinstance(model, str) else None,
        last_user_turn=last_user,
        response_1=response_1,
        response_2=response_2,
        principle=read.principle,
        max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        roles=read.roles,
        input_words=len(words(all_text + " " + (read.principle or ""))),
        messages=tuple(read.ordered),
        stream=body.get("stream") is True,
        include_usage=include_usage,
    )


@dataclass(frozen=True)
class _Usage:
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    reasoning_tokens: int


def _answer_text(
    request: JudgeRequest, outcome: str, sequence: int, config: FakeJudgeConfig
) -> str:
    if outcome == "budget_exhaust":
        return PARTIAL_TEXT
    if outcome == "empty":
        return ""
    if outcome == "malformed":
        return MALFORMED_TEXT
    if outcome == "adversarial":
        return adversarial_text(config.adversarial_kind, config.adversarial_chars, sequence)
    return verdict_text(request.last_user_turn, request.response_1, request.response_2)


def _usage(request: JudgeRequest, outcome: str, text: str, plan: Plan | None) -> _Usage:
    """Token counts: from the words, or the node's plan; a budget exhaustion spends it all."""
    output_tokens = len(words(REASONING_SUMMARY)) + len(words(text))
    if plan is not None and plan.output_tokens is not None:
        output_tokens = max(plan.output_tokens, len(words(text)))
    if outcome == "budget_exhaust":
        output_tokens = max(output_tokens, request.max_tokens or 4096)
    return _Usage(
        input_tokens=request.input_words if plan is None else plan.prompt_tokens,
        cached_tokens=0 if plan is None else plan.cached_tokens,
        output_tokens=output_tokens,
        reasoning_tokens=max(0, output_tokens - len(words(text))),
    )


def _responses_answer(
    text: str, incomplete: bool, sequence: int, model: str, usage: _Usage
) -> dict[str, Any]:
    status = "incomplete" if incomplete else "completed"
    return {
        "id": f"resp_fake_{sequence:08d}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": [
            {
                "id": f"rs_fake_{sequence:08d}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": REASONING_SUMMARY}],
            },
            {
                "id": f"msg_fake_{sequence:08d}",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            },
        ],
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }


def _chat_answer(
    text: str, incomplete: bool, sequence: int, model: str, usage: _Usage
) -> dict[str, Any]:
    message = {"role": "assistant", "content": text, "reasoning_content": REASONING_SUMMARY}
    return {
        "id": f"chatcmpl-fake-{sequence:08d}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "length" if incomplete else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        },
    }


def answer_body(
    request: JudgeRequest,
    outcome: str,
    sequence: int,
    config: FakeJudgeConfig,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """The JSON answer for a 200 outcome: ok, budget_exhaust, empty, malformed, adversarial.

    With a node ``plan``, usage carries its simulated prompt, cached and output tokens."""
    text = _answer_text(request, outcome, sequence, config)
    usage = _usage(request, outcome, text, plan)
    build = _responses_answer if request.endpoint == "responses" else _chat_answer
    return build(text, outcome == "budget_exhaust", sequence, request.model or "fake-genrm", usage)


def models_body(models: tuple[str, ...]) -> dict[str, Any]:
    """``GET /v1/models`` as vLLM answers it: one ``model`` object per served name."""
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "fake-judge"}
            for name in models
        ],
    }


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}
