"""The fake judge's wire bodies: reading a judge request, writing an answer or an error.

Pure functions of the request and the fake judge's state (``genrm_grpc.testing.server``
serves them over HTTP, streamed or not). Both wire formats are read and written, as
described in the server's docstring.
"""

from __future__ import annotations

import time
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


def parse_judge_request(endpoint: str, body: object) -> JudgeRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    model = model if isinstance(model, str) else None
    conversation: list[tuple[str, str]] = []
    principle: str | None = None
    response_1: object = None
    response_2: object = None
    if endpoint == "responses":
        raw_input = body.get("input")
        if isinstance(raw_input, str):
            conversation.append(("user", raw_input))
        elif isinstance(raw_input, list):
            for item in raw_input:
                if isinstance(item, dict) and isinstance(item.get("role"), str):
                    conversation.append((item["role"], _text_of(item.get("content"))))
        else:
            raise BadRequest("'input' must be a string or a list of messages")
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            raise BadRequest("'metadata' with response_1 and response_2 is required")
        response_1 = metadata.get("response_1")
        response_2 = metadata.get("response_2")
        raw_principle = metadata.get("principle")
        principle = raw_principle if isinstance(raw_principle, str) else None
        roles = tuple(role for role, _ in conversation)
        max_tokens = body.get("max_output_tokens")
        ordered: list[tuple[str, str]] = [
            *conversation,
            *([("principle", principle)] if principle is not None else []),
            *(
                (role, value)
                for role, value in (("response_1", response_1), ("response_2", response_2))
                if isinstance(value, str)
            ),
        ]
    else:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("'messages' must be a list")
        role_list: list[str] = []
        ordered = []
        for item in messages:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise BadRequest("every message needs a string 'role'")
            role, text = item["role"], _text_of(item.get("content"))
            role_list.append(role)
            ordered.append((role, text))
            if role == "response_1":
                response_1 = text
            elif role == "response_2":
                response_2 = text
            elif role == "principle":
                principle = text
            else:
                conversation.append((role, text))
        roles = tuple(role_list)
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if not isinstance(response_1, str) or not isinstance(response_2, str):
        raise BadRequest("both response_1 and response_2 are required")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    last_user = next((text for role, text in reversed(conversation) if role == "user"), "")
    all_text = " ".join([*(text for _, text in conversation), response_1, response_2])
    return JudgeRequest(
        endpoint=endpoint,
        model=model,
        last_user_turn=last_user,
        response_1=response_1,
        response_2=response_2,
        principle=principle,
        max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        roles=roles,
        input_words=len(words(all_text + " " + (principle or ""))),
        messages=tuple(ordered),
        stream=stream,
        include_usage=include_usage,
    )


def answer_body(
    request: JudgeRequest,
    outcome: str,
    sequence: int,
    config: FakeJudgeConfig,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """The JSON answer for a 200 outcome: ok, budget_exhaust, empty, malformed, adversarial.

    With a node ``plan``, usage carries its simulated prompt, cached and output tokens."""
    reasoning = REASONING_SUMMARY
    if outcome == "budget_exhaust":
        text = PARTIAL_TEXT
    elif outcome == "empty":
        text = ""
    elif outcome == "malformed":
        text = MALFORMED_TEXT
    elif outcome == "adversarial":
        text = adversarial_text(config.adversarial_kind, config.adversarial_chars, sequence)
    else:
        text = verdict_text(request.last_user_turn, request.response_1, request.response_2)
    reasoning_tokens = len(words(reasoning))
    output_tokens = reasoning_tokens + len(words(text))
    if plan is not None and plan.output_tokens is not None:
        output_tokens = max(plan.output_tokens, len(words(text)))
    if outcome == "budget_exhaust":
        output_tokens = max(output_tokens, request.max_tokens or 4096)
    reasoning_tokens = max(0, output_tokens - len(words(text)))
    input_tokens = request.input_words if plan is None else plan.prompt_tokens
    cached_tokens = 0 if plan is None else plan.cached_tokens
    model = request.model or "fake-genrm"
    created = int(time.time())
    if request.endpoint == "responses":
        body: dict[str, Any] = {
            "id": f"resp_fake_{sequence:08d}",
            "object": "response",
            "created_at": created,
            "model": model,
            "status": "completed",
            "incomplete_details": None,
            "output": [
                {
                    "id": f"rs_fake_{sequence:08d}",
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": reasoning}],
                },
                {
                    "id": f"msg_fake_{sequence:08d}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                },
            ],
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": cached_tokens},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": input_tokens + output_tokens,
            },
        }
        if outcome == "budget_exhaust":
            body["status"] = "incomplete"
            body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["output"][1]["status"] = "incomplete"
        return body
    return {
        "id": f"chatcmpl-fake-{sequence:08d}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "reasoning_content": reasoning},
                "finish_reason": "length" if outcome == "budget_exhaust" else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        },
    }


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
