"""``judge.stream``: the streamed answer (server-sent events) parses exactly as the
non-streamed one, on every answer shape the fake judge emits, both wire formats.

Two fake judges with the same seed and configuration answer the same sequence of
requests, one streamed and one not (real HTTP over loopback); each comparison gets one
attempt (``genrm_parse_retries: 0``), so its outcome is that attempt's parse.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from genrm_grpc.judge.client import (
    JudgeClient,
    JudgeFailedError,
    JudgeInput,
    _read_answer,
    _read_usage,
)
from genrm_grpc.judge.sse import SSEAnswer, StreamError, StreamTooLarge
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.testing.faults import ADVERSARIAL_KINDS
from genrm_grpc.testing.node import NodeConfig
from tests.judge.views import judge_settings

PROMPT = "Name the largest planet in the solar system."
INPUTS = [
    JudgeInput(
        messages=(("system", "Be concise."), ("user", PROMPT)),
        response_1=f"Jupiter is the largest planet, answer {n}.",
        response_2="Saturn." if n % 2 else "  It is Jupiter  \n",
        principle="Prefer correct answers." if n % 2 else None,
    )
    for n in range(3)
]

#: (name, fake judge faults, node settings, client settings): every answer shape.
SHAPES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("ok", {}, {}, {}),
    ("ok_max_output_tokens", {}, {}, {"max_output_tokens": 2048}),
    ("budget_exhaust", {"budget_exhaust_first_n": 9}, {}, {"max_output_tokens": 300}),
    ("empty", {"empty_first_n": 9}, {}, {}),
    ("malformed", {"malformed_first_n": 9}, {}, {}),
    *(
        (
            f"adversarial_{kind}",
            {"adversarial_first_n": 9, "adversarial_kind": kind, "adversarial_chars": 4096},
            {},
            {},
        )
        for kind in ("cycle", *ADVERSARIAL_KINDS)
    ),
    ("invalid_json", {"invalid_json_first_n": 9}, {}, {}),
    ("truncate", {"truncate_first_n": 9}, {}, {}),
    ("fail_503", {"fail_503_first_n": 9}, {}, {}),
    ("fail_429", {"fail_429_first_n": 9, "retry_after_s": None}, {}, {}),
    ("fail_400", {"fail_400_first_n": 9}, {}, {}),
    ("reset", {"reset_first_n": 9}, {}, {}),
    ("length_fixed", {}, {"output_tokens": "300"}, {}),
    ("length_uniform", {}, {"output_tokens": "uniform:40:400"}, {"max_output_tokens": 4096}),
    (
        "length_bimodal_runaway",
        {},
        {"output_tokens": "bimodal:60:budget:0.5:20"},
        {"max_output_tokens": 500},
    ),
    ("slow_mode", {}, {"mode": "slow", "slow_factor": 1.0, "slow_ms": 1.0}, {}),
]


async def _outcomes(
    fake: FakeJudgeServer, api: str, stream: bool, client_keys: dict[str, Any]
) -> list[object]:
    config = judge_settings(
        fake.url,
        api=api,
        model="genrm",
        stream=stream,
        genrm_parse_retries=0,
        judge_request_timeout_s=10.0,
        **client_keys,
    )

    async def no_sleep(_seconds: float) -> None:
        return None

    results: list[object] = []
    async with JudgeClient(config, sleep=no_sleep, connect_retries=0) as client:
        for inp in INPUTS:
            try:
                results.append(await client.judge(inp))
            except JudgeFailedError as exc:
                results.append(("failed", exc.kind, exc.reason))
    return results


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
@pytest.mark.parametrize(
    ("shape", "faults", "node", "client_keys"), SHAPES, ids=[s[0] for s in SHAPES]
)
async def test_streamed_and_non_streamed_answers_give_identical_outcomes(
    api: str,
    shape: str,
    faults: dict[str, Any],
    node: dict[str, Any],
    client_keys: dict[str, Any],
) -> None:
    outcomes = {}
    requests = {}
    for stream in (False, True):
        config = FakeJudgeConfig(seed=7, node=NodeConfig(**node), **faults)
        with FakeJudgeServer(config) as fake:
            outcomes[stream] = await _outcomes(fake, api, stream, client_keys)
            requests[stream] = fake.stats()["last_request"]
    assert outcomes[True] == outcomes[False]
    assert requests[True]["stream"] is True and requests[False]["stream"] is False


def _raw(fake: FakeJudgeServer, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
    connection = http.client.HTTPConnection(fake.host, fake.port, timeout=30)
    try:
        connection.request(
            "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


def _body(api: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    if api == "responses":
        return "/v1/responses", {
            "model": "genrm",
            "input": [{"role": "user", "content": PROMPT}],
            "metadata": {"response_1": "Jupiter.", "response_2": "Saturn, I think."},
            **extra,
        }
    return "/v1/chat/completions", {
        "model": "genrm",
        "messages": [
            {"role": "user", "content": PROMPT},
            {"role": "response_1", "content": "Jupiter."},
            {"role": "response_2", "content": "Saturn, I think."},
        ],
        **extra,
    }


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
@pytest.mark.parametrize("fault", ["ok", "budget_exhaust", "empty", "malformed", "adversarial"])
def test_the_reassembled_stream_reads_as_the_body_with_the_same_answer_and_usage(
    api: str, fault: str
) -> None:
    """Below the client: the fake's raw stream, fed in 7-byte pieces, reassembles into
    what ``_read_answer``/``_read_usage`` read from the non-streamed body."""
    faults = {} if fault == "ok" else {f"{fault}_first_n": 9}
    extra: dict[str, Any] = {"max_output_tokens" if api == "responses" else "max_tokens": 64}
    read = {}
    for stream in (False, True):
        config = FakeJudgeConfig(seed=3, node=NodeConfig(output_tokens="40"), **faults)
        with FakeJudgeServer(config) as fake:
            options = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            path, body = _body(api, **extra, **options)
            content_type, raw = _raw(fake, path, body)
        if stream:
            assert content_type == "text/event-stream"
            answer = SSEAnswer(api, 1 << 20)  # type: ignore[arg-type]
            tokens = sum(answer.feed(raw[k : k + 7]) for k in range(0, len(raw), 7))
            assert answer.done
            decoded = answer.body()
            assert tokens == _read_usage(decoded, api).output_tokens  # type: ignore[arg-type, union-attr]
        else:
            decoded = json.loads(raw)
        read[stream] = (_read_answer(decoded, api), _read_usage(decoded, api))  # type: ignore[arg-type]
    assert read[True] == read[False]


def test_a_chat_stream_without_content_reads_as_an_answer_without_content() -> None:
    answer = SSEAnswer("chat_completions", 1024)
    answer.feed(
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
    )
    answer.feed(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\r\n\r\n')
    answer.feed(b"data: [DONE]\n\n")
    assert answer.done and answer.tokens == 0
    assert _read_answer(answer.body(), "chat_completions") == ("", "completed")


def test_a_chat_stream_with_no_choice_reads_as_a_body_without_choices() -> None:
    answer = SSEAnswer("chat_completions", 1024)
    answer.feed(
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}\n\n'
        b"data: [DONE]\n\n"
    )
    with pytest.raises(ValueError, match="'choices' is missing"):
        _read_answer(answer.body(), "chat_completions")


def test_stream_errors_and_oversized_answers_are_typed() -> None:
    with pytest.raises(StreamError):
        SSEAnswer("chat_completions", 1024).feed(b"data: <html>\n\n")
    with pytest.raises(StreamError):
        SSEAnswer("responses", 1024).feed(b'data: {"type":"error","message":"boom"}\n\n')
    big = json.dumps({"type": "response.output_text.delta", "delta": "x" * 600}).encode()
    answer = SSEAnswer("responses", 1024)
    answer.feed(b"data: " + big + b"\n\n")
    with pytest.raises(StreamTooLarge):
        answer.feed(b"data: " + big + b"\n\n")
    with pytest.raises(StreamTooLarge):
        SSEAnswer("responses", 1024).feed(b"data: " + b"y" * 2000)


def test_responses_terminal_event_without_a_response_is_a_stream_error() -> None:
    answer = SSEAnswer("responses", 1024)
    answer.feed(b'event: response.completed\ndata: {"type":"response.completed"}\n\n')
    assert answer.done
    with pytest.raises(StreamError):
        answer.body()
