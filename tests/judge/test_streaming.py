"""``judge.stream``: the streamed answer (server-sent events) parses exactly as the
non-streamed one, on every answer shape the fake judge emits, both wire formats.

Two fake judges with the same seed and configuration answer the same sequence of
requests, one streamed and one not (real HTTP over loopback); each comparison gets one
attempt (``genrm_parse_retries: 0``), so its outcome is that attempt's parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.judge.client import (
    JudgeClient,
    JudgeFailedError,
    JudgeInput,
    JudgeProgress,
)
from genrm_grpc.judge.sse import SSEAnswer, StreamError, StreamTooLarge
from genrm_grpc.judge.wire import read_answer, read_usage
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.testing.faults import ADVERSARIAL_KINDS
from genrm_grpc.testing.node import NodeConfig
from tests.judge.views import PLANET, PLANET_KEYED, judge_settings, no_sleep

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
    what ``read_answer``/``read_usage`` read from the non-streamed body."""
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
            assert tokens == read_usage(decoded, api).output_tokens  # type: ignore[arg-type, union-attr]
        else:
            decoded = json.loads(raw)
        read[stream] = (read_answer(decoded, api), read_usage(decoded, api))  # type: ignore[arg-type]
    assert read[True] == read[False]


def test_a_chat_stream_without_content_reads_as_an_answer_without_content() -> None:
    answer = SSEAnswer("chat_completions", 1024)
    answer.feed(
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n'
    )
    answer.feed(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\r\n\r\n')
    answer.feed(b"data: [DONE]\n\n")
    assert answer.done and answer.tokens == 0
    assert read_answer(answer.body(), "chat_completions") == ("", "completed")


def test_a_chat_stream_with_no_choice_reads_as_a_body_without_choices() -> None:
    answer = SSEAnswer("chat_completions", 1024)
    answer.feed(
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}\n\n'
        b"data: [DONE]\n\n"
    )
    with pytest.raises(ValueError, match="'choices' is missing"):
        read_answer(answer.body(), "chat_completions")


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


# -- first token, progress, closing (in-process fake judges over loopback) ------------


def _streaming(urls: list[str], **keys: Any) -> Settings:
    judge = {"stream": True, "first_token_timeout_s": 0.3, **keys.pop("judge", {})}
    top = {"genrm_parse_retries": 1, "judge_request_timeout_s": 30.0, **keys}
    return Settings(judge={"urls": urls, **judge}, **top)


@pytest.mark.parametrize("mode", ["stall", "hang"])
@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_with_one_endpoint_no_first_token_fails_the_comparison_at_once(
    mode: str, api: str
) -> None:
    """Gym's rule for a hung request with one endpoint, as for the request timeout:
    final, long before ``judge_request_timeout_s`` (30 s here)."""
    with FakeJudgeServer() as fake:
        fake.control(mode=mode)
        config = _streaming([fake.url], judge={"api": api})
        async with JudgeClient(config, sleep=no_sleep) as client:
            with pytest.raises(JudgeFailedError) as excinfo:
                await client.judge(PLANET_KEYED)
            assert client.tokens.first_token_timeouts == 1
            endpoint = client.farm.endpoints[0]
            assert endpoint.failures == 1 and "no first token" in endpoint.detail
        node = fake.wait_for_node(hung=1, aborted=1)  # the client closed it
    assert excinfo.value.kind == "first_token"
    assert "judge.first_token_timeout_s=0.3s on attempt 1 of 2" in excinfo.value.reason
    assert node["requests"] == 1


async def test_with_one_endpoint_the_outage_tolerance_covers_a_missing_first_token() -> None:
    with FakeJudgeServer() as fake:
        fake.control(mode="stall")

        async def recover(_seconds: float) -> None:
            fake.control(mode="ok")

        config = _streaming([fake.url], judge_outage_tolerance_s=60.0, genrm_parse_retries=0)
        async with JudgeClient(config, sleep=recover) as client:
            out = await client.judge(PLANET_KEYED)
    assert out.attempts == 2  # the first attempt spent no budget (retries: 0)
    assert not out.verdict.parse_failed


async def test_in_a_farm_no_first_token_is_retried_on_the_other_endpoint() -> None:
    with FakeJudgeServer() as a, FakeJudgeServer() as b:
        config = _streaming([a.url, b.url], judge={"hedge_quantile": None})
        async with JudgeClient(config, sleep=no_sleep) as client:
            first = client.farm.pick(PLANET_KEYED.affinity)
            assert first is not None
            sick, well = (a, b) if first.url == a.url else (b, a)
            sick.control(mode="stall")
            out = await client.judge(PLANET_KEYED)
            failures = {e.url: e.failures for e in client.farm.endpoints}
        assert sick.wait_for_node(aborted=1)["hung"] == 1
        assert well.node_stats()["completed"] == 1
        assert failures == {sick.url: 1, well.url: 0}
    assert out.attempts == 2 and not out.verdict.parse_failed


async def test_a_slow_answer_that_has_begun_is_not_cut_by_the_first_token_timeout() -> None:
    # 20 tokens at 40 tokens/s: 0.5 s of decode, past the 0.3 s first-token timeout.
    node = NodeConfig(tokens_per_s=40, output_tokens="20")
    with FakeJudgeServer(FakeJudgeConfig(node=node)) as fake:
        async with JudgeClient(_streaming([fake.url]), sleep=no_sleep) as client:
            out = await client.judge(PLANET_KEYED)
            assert client.tokens.first_token_timeouts == 0
    assert out.attempts == 1 and not out.verdict.parse_failed


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_progress_counts_the_tokens_of_a_running_comparison_and_lets_go_after(
    api: str,
) -> None:
    node = NodeConfig(tokens_per_s=100, output_tokens="200")  # 2 s of decode
    with FakeJudgeServer(FakeJudgeConfig(node=node)) as fake:
        progress = JudgeProgress()
        inp = replace(PLANET, progress=progress)
        config = _streaming([fake.url], judge={"api": api, "first_token_timeout_s": 5.0})
        async with JudgeClient(config, sleep=no_sleep) as client:
            task = asyncio.ensure_future(client.judge(inp))
            seen: list[tuple[int, int, int]] = []
            while not task.done():
                seen.append((progress.in_flight, progress.tokens, client.tokens.streamed_in_flight))
                await asyncio.sleep(0.05)  # sampling the counters, not waiting for an event
            out = await task
            after = (progress.in_flight, progress.tokens, client.tokens.streamed_in_flight)
    streamed = [tokens for in_flight, tokens, _ in seen if in_flight == 1 and tokens > 0]
    assert len(set(streamed)) >= 3  # it grew as the tokens came, not all at once
    assert all(tokens == total for _, tokens, total in seen)  # one request: gauge = cohort
    assert max(streamed) <= 200 == out.usage.output_tokens  # type: ignore[union-attr]
    assert after == (0, 0, 0)


async def test_a_hedge_that_wins_closes_the_slow_stream_at_the_judge() -> None:
    slow = FakeJudgeConfig(node=NodeConfig(tokens_per_s=2, output_tokens="600"))
    with FakeJudgeServer(slow) as a, FakeJudgeServer(slow) as b:
        config = _streaming(
            [a.url, b.url], judge_hedge_after_s=0.3, judge={"first_token_timeout_s": 10.0}
        )
        async with JudgeClient(config, sleep=no_sleep) as client:
            first = client.farm.pick(PLANET_KEYED.affinity)
            assert first is not None
            slow_one, fast_one = (a, b) if first.url == a.url else (b, a)
            fast_one.control(tokens_per_s=0)  # answers at once
            out = await client.judge(PLANET_KEYED)
            gauge = client.tokens.streamed_in_flight
        closed = slow_one.wait_for_node(aborted_running=1)
    assert not out.verdict.parse_failed
    assert closed["completed"] == 0 and closed["generation_tokens"] < 600
    assert gauge == 0


# -- the fake judge's stream -----------------------------------------------------------


@contextlib.contextmanager
def _open_stream(fake: FakeJudgeServer, api: str) -> Iterator[http.client.HTTPResponse]:
    """A streamed request's response; the connection's socket is closed on the way out
    (closing the response alone leaves it to the garbage collector)."""
    path, body = _body(api, stream=True, stream_options={"include_usage": True})
    connection = http.client.HTTPConnection(fake.host, fake.port, timeout=30)
    try:
        connection.request(
            "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        yield connection.getresponse()
    finally:
        connection.close()


def _next_event(response: http.client.HTTPResponse) -> bytes:
    lines = []
    while (line := response.readline()) not in (b"\n", b"\r\n", b""):
        lines.append(line)
    return b"".join(lines)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_the_fake_judge_emits_its_tokens_over_the_simulated_decode_time(api: str) -> None:
    node = NodeConfig(tokens_per_s=50, output_tokens="100")  # 2 s of decode
    with FakeJudgeServer(FakeJudgeConfig(node=node)) as fake:
        with _open_stream(fake, api) as response:
            assert response.status == 200
            assert response.getheader("Content-Type") == "text/event-stream"
            _next_event(response)  # the opening event
            first = _next_event(response)
            assert b"delta" in first
            assert fake.node_stats()["completed"] == 0  # a token came, the answer is not done
            rest = response.read()
        stats = fake.wait_for_node(completed=1)
    assert stats["generation_tokens"] == 100
    assert (b"[DONE]" if api == "chat_completions" else b"response.completed") in rest


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_a_stream_closed_mid_answer_is_counted_as_an_abort(api: str) -> None:
    node = NodeConfig(tokens_per_s=20, output_tokens="400")
    with FakeJudgeServer(FakeJudgeConfig(node=node)) as fake:
        with _open_stream(fake, api) as response:
            _next_event(response)
            _next_event(response)
        # The client went away after its first token.
        stats = fake.wait_for_node(aborted_running=1)
    assert stats["completed"] == 0 and stats["generation_tokens"] < 400


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_stall_mode_opens_the_stream_and_sends_no_token(api: str) -> None:
    with FakeJudgeServer() as fake:
        fake.control(mode="stall")
        with _open_stream(fake, api) as response:
            assert response.status == 200
            opening = _next_event(response)
            assert (
                b"response.created" if api == "responses" else b'"role": "assistant"'
            ) in opening
            assert b"delta" not in opening.replace(b'"delta": {"role"', b"")
            fake.wait_for_node(hung=1)
        stats = fake.wait_for_node(aborted=1)
    assert stats["completed"] == 0 and stats["generation_tokens"] == 0


# -- the answer cap and the loop -------------------------------------------------------


async def test_a_large_streamed_answer_is_decoded_and_parsed_off_the_loop() -> None:
    from tests.judge.test_response_cap_and_offload import CountingExecutor

    config = FakeJudgeConfig(
        adversarial_first_n=9, adversarial_kind="open_braces", adversarial_chars=200_000
    )
    executor = CountingExecutor()
    try:
        with FakeJudgeServer(config) as fake:
            settings = _streaming([fake.url], genrm_parse_retries=0)
            async with JudgeClient(settings, offload_bytes=1024, executor=executor) as client:
                out = await client.judge(PLANET_KEYED)
    finally:
        executor.shutdown()
    assert out.verdict.parse_failed  # built to have no verdict, whichever way it came
    assert len(executor.threads) >= 2  # the long event, then its parse
    assert all(name.startswith("judge-decode") for name in executor.threads)


async def test_a_small_streamed_answer_stays_on_the_loop() -> None:
    from tests.judge.test_response_cap_and_offload import CountingExecutor

    executor = CountingExecutor()
    try:
        with FakeJudgeServer() as fake:
            settings = _streaming([fake.url])
            async with JudgeClient(settings, offload_bytes=1 << 20, executor=executor) as client:
                out = await client.judge(PLANET_KEYED)
    finally:
        executor.shutdown()
    assert not out.verdict.parse_failed
    assert executor.threads == []


async def test_a_streamed_answer_over_max_response_bytes_fails_like_an_unparseable_one() -> None:
    config = FakeJudgeConfig(adversarial_first_n=9, adversarial_chars=8192)
    with FakeJudgeServer(config) as fake:
        settings = _streaming([fake.url], judge={"max_response_bytes": 4096})
        async with JudgeClient(settings, sleep=no_sleep) as client:
            out = await client.judge(PLANET_KEYED)
    assert out.attempts == 2 and out.verdict.parse_failed  # answered: the default verdict
