"""What the judge client puts on the wire and how it reads an answer off it (no I/O).

The request body of either wire format (docs/protocol.md: ``responses``, NeMo Gym's
GenRM model server, answers in ``metadata``; ``chat_completions``, vLLM serving the
GenRM chat template, answers as ``response_1``/``response_2`` roles), its JSON
encoding, and the reading of a 2xx body: the answer text, its state, the token usage
and the verdict. ``decode_answer`` and ``interpret_answer`` are pure CPU, which is why
the client may run them on a worker thread for large bodies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from genrm_grpc.judge.attempts import AttemptFailed, Tally
from genrm_grpc.judge.farm import Endpoint
from genrm_grpc.judge.redact import split_userinfo
from genrm_grpc.judge.texts import budget_label, excerpt, excerpt_bytes
from genrm_grpc.judge.types import JudgeInput, TokenUsage
from genrm_grpc.judge.views import JudgeApi, JudgeBlockView, JudgeView
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.scoring.verdict import parse_verdict


def judge_base_url(url: str) -> str:
    """The judge's base URL without user-info and without a ``/v1`` suffix."""
    base = split_userinfo(url)[0].rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


def judge_endpoint(url: str, api: JudgeApi) -> str:
    """The full URL that judge requests are POSTed to (no user-info)."""
    path = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    return judge_base_url(url) + path


def build_payload(judge: JudgeBlockView, inp: JudgeInput) -> dict[str, Any]:
    """The request body (before encoding) that asks ``judge`` to compare ``inp``."""
    conversation = [{"role": role, "content": content} for role, content in inp.messages]
    body: dict[str, Any] = {"model": judge.model}
    if judge.api == "responses":
        metadata = {"response_1": inp.response_1, "response_2": inp.response_2}
        if inp.principle:
            metadata["principle"] = inp.principle
        body["input"] = conversation
        body["metadata"] = metadata
        if judge.max_output_tokens is not None:
            body["max_output_tokens"] = judge.max_output_tokens
    else:
        messages = list(conversation)
        if inp.principle:
            messages.append({"role": "principle", "content": inp.principle})
        messages.append({"role": "response_1", "content": inp.response_1})
        messages.append({"role": "response_2", "content": inp.response_2})
        body["messages"] = messages
        if judge.max_output_tokens is not None:
            body["max_tokens"] = judge.max_output_tokens
    if judge.temperature is not None:
        body["temperature"] = judge.temperature
    if judge.top_p is not None:
        body["top_p"] = judge.top_p
    if judge.stream:
        body["stream"] = True
        if judge.api == "chat_completions":
            body["stream_options"] = {"include_usage": True}
    return body


def with_budget(api: JudgeApi, payload: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """``payload`` with its output budget set to ``limit`` (removed for None)."""
    key = "max_output_tokens" if api == "responses" else "max_tokens"
    out = dict(payload)
    if limit is None:
        out.pop(key, None)
    else:
        out[key] = limit
    return out


@dataclass(frozen=True)
class Answer:
    """A decoded 2xx body: the verdict (or None), the answer's state and its usage."""

    text: str
    state: str
    verdict: Verdict | None
    usage: TokenUsage | None


def decode_answer(cfg: JudgeView, raw: bytes, attempt_no: int) -> Answer:
    """JSON-decode a 2xx body, extract the answer and parse its verdict (pure CPU)."""
    try:
        body = decode_json(raw)
    except ValueError:
        raise AttemptFailed(
            "invalid_body",
            f"attempt {attempt_no}: HTTP 2xx body is not JSON",
            log_detail=f"attempt {attempt_no}: body is not JSON: {excerpt_bytes(raw)}",
        ) from None
    return interpret_answer(cfg, body, attempt_no)


def interpret_answer(cfg: JudgeView, body: Any, attempt_no: int) -> Answer:
    """Extract the answer of a decoded (or reassembled streamed) 2xx body and parse
    its verdict (pure CPU)."""
    if not isinstance(body, dict):
        raise AttemptFailed(
            "invalid_body", f"attempt {attempt_no}: HTTP 2xx body is not a JSON object"
        )
    usage = read_usage(body, cfg.judge.api)
    try:
        text, state = read_answer(body, cfg.judge.api)
    except ValueError as exc:
        raise AttemptFailed(
            "invalid_body", f"attempt {attempt_no}: unexpected answer shape: {exc}"
        ) from None
    verdict = None
    if state == "completed" and text.strip():
        verdict = parse_verdict(
            text, default_score=cfg.default_score, default_ranking=cfg.default_ranking
        )
    return Answer(text, state, verdict, usage)


def count_usage(answer: Answer, endpoint: Endpoint | None, tally: Tally) -> None:
    """Add the answer's token usage to the comparison's and its endpoint's counts."""
    tally.last_output = answer.usage.output_tokens if answer.usage is not None else 0
    if answer.usage is not None:
        tally.add_usage(answer.usage)
        if endpoint is not None:
            endpoint.input_tokens += answer.usage.input_tokens
            endpoint.output_tokens += answer.usage.output_tokens
            endpoint.cached_tokens += answer.usage.cached_tokens
    if answer.verdict is None:
        tally.wasted_output += tally.last_output


def verdict_of(answer: Answer, tally: Tally, cap: int | None) -> Verdict:
    """The answer's verdict, or the ``AttemptFailed`` that says why there is none."""
    attempt_no = tally.attempts
    if answer.state == "budget_exhausted":
        tally.budget_exhausted += 1
        used = f"max_output_tokens={budget_label(tally.limit)}"
        if tally.adaptive:
            tally.adaptive_cuts += 1
            used += f", the adaptive budget; configured cap {budget_label(cap)}"
        raise AttemptFailed(
            "incomplete_max_output_tokens",
            f"attempt {attempt_no}: answer incomplete, the judge ran out of output tokens ({used})",
        )
    if answer.state != "completed":
        raise AttemptFailed(
            "incomplete", f"attempt {attempt_no}: answer not completed ({answer.state})"
        )
    if not answer.text.strip():
        raise AttemptFailed("empty_answer", f"attempt {attempt_no}: completed answer is empty")
    if answer.verdict is None:
        raise AttemptFailed(
            "unparseable",
            f"attempt {attempt_no}: answer has no valid verdict JSON",
            answered=True,
            log_detail=(
                f"attempt {attempt_no}: answer has no valid verdict JSON: {excerpt(answer.text)}"
            ),
        )
    return answer.verdict


def encode(payload: dict[str, Any]) -> bytes:
    """A request body as JSON bytes: orjson (about 30× faster than ``json.dumps`` on two
    2 KiB answers, docs/performance.md); it writes UTF-8 where ``json`` writes ``\\u``
    escapes, the same JSON. Text orjson refuses (a lone surrogate) goes through ``json``.
    The only numbers sent are settings that ``genrm_grpc.config`` keeps finite (orjson
    would write a NaN as ``null``)."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload).encode("utf-8")


def decode_json(raw: bytes) -> Any:
    """A response body decoded as ``json.loads`` decodes it, with orjson's speed.

    orjson refuses a few bodies that ``json.loads`` reads (``NaN``, ``Infinity``,
    escaped lone surrogates, nesting deeper than 1024); those go through ``json.loads``,
    so which bodies decode is what it was with ``json`` alone. One value differs:
    orjson reads an integer beyond 64 bits as a float; the only integers the client
    reads are token counts, and ``_count`` leaves those uncounted from either decoder.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def read_answer(body: dict[str, Any], api: JudgeApi) -> tuple[str, str]:
    """The answer text and its state: ``completed``, ``budget_exhausted`` or other."""
    if api == "responses":
        output = body.get("output")
        if output is None:
            output = []
        if not isinstance(output, list):
            raise ValueError("'output' is not a list")
        text = "".join(
            part["text"]
            for item in output
            if isinstance(item, dict) and item.get("type") == "message"
            for part in (item.get("content") or [])
            if isinstance(part, dict)
            and part.get("type") == "output_text"
            and isinstance(part.get("text"), str)
        )
        status = body.get("status")
        if status is None or status == "completed":
            return text, "completed"
        if status == "incomplete":
            details = body.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            if reason == "max_output_tokens":
                return text, "budget_exhausted"
            return text, f"status 'incomplete', reason {reason!r}"
        return text, f"status {status!r}"

    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("'choices' is missing or empty")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ValueError("'choices[0].message' is missing")
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    else:
        raise ValueError("'choices[0].message.content' is neither text nor parts")
    if choice.get("finish_reason") == "length":
        return text, "budget_exhausted"
    return text, "completed"


def read_usage(body: dict[str, Any], api: JudgeApi) -> TokenUsage | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    if api == "responses":
        input_key, output_key, details_key, cached_key = (
            "input_tokens",
            "output_tokens",
            "output_tokens_details",
            "input_tokens_details",
        )
    else:
        input_key, output_key, details_key, cached_key = (
            "prompt_tokens",
            "completion_tokens",
            "completion_tokens_details",
            "prompt_tokens_details",
        )
    input_tokens = _count(usage.get(input_key))
    output_tokens = _count(usage.get(output_key))
    if input_tokens is None and output_tokens is None:
        return None
    details = usage.get(details_key)
    reasoning = _count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
    prompt_details = usage.get(cached_key)
    cached = (
        _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else None
    )
    return TokenUsage(input_tokens or 0, output_tokens or 0, reasoning or 0, cached or 0)


#: Token counts from 2**64 on are not counts a judge can report; orjson also reads such
#: integers as floats (``json`` as ints), so both decoders leave them uncounted.
_MAX_COUNT = 2**64 - 1


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        return None
    return value
