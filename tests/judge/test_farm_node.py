"""The fake judge as a farm node (simulated): slots, aborts, prefix cache, budget cuts,
sick modes switched at run time, vLLM-named metrics. A real HTTP server on loopback;
waits go through its ``GET /wait`` long-poll, never sleeps."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.testing.node import NodeConfig

PROMPT = " ".join(f"word{n}" for n in range(64))  # four 16-token blocks and more


def _chat(response_1: str = "Paris.", response_2: str = "Lyon.", **extra: Any) -> dict[str, Any]:
    return {
        "model": "genrm",
        "messages": [
            {"role": "user", "content": PROMPT},
            {"role": "response_1", "content": response_1},
            {"role": "response_2", "content": response_2},
        ],
        **extra,
    }


def _request(
    fake: FakeJudgeServer, method: str, path: str, body: object = None, timeout: float = 30
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(fake.host, fake.port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, payload, {"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode()
    finally:
        connection.close()


def _node(fake: FakeJudgeServer, **wait_for: int) -> dict[str, Any]:
    query = "&".join(f"{k}={v}" for k, v in wait_for.items())
    status, body = _request(fake, "GET", f"/wait?{query}&timeout=20")
    assert status == 200, body
    node: dict[str, Any] = body  # /wait answers the node counters themselves
    return node


def _open_request(fake: FakeJudgeServer, body: object) -> socket.socket:
    """Send a request and leave the connection open (the caller hangs up later)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection((fake.host, fake.port), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: judge\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload
    )
    return sock


@pytest.fixture
def slow_node() -> Iterator[FakeJudgeServer]:
    # 2 slots, 1 token/s, 1,000 tokens: a request holds its slot until it is aborted.
    node = NodeConfig(slots=2, tokens_per_s=1.0, output_tokens="1000")
    with FakeJudgeServer(FakeJudgeConfig(node=node)) as fake:
        yield fake


def test_at_most_slots_requests_generate_the_rest_wait_and_hang_ups_are_aborts(
    slow_node: FakeJudgeServer,
) -> None:
    socks = [_open_request(slow_node, _chat(max_tokens=4096)) for _ in range(2)]
    try:
        _node(slow_node, running=2)
        socks.append(_open_request(slow_node, _chat(max_tokens=4096)))
        node = _node(slow_node, running=2, waiting=1)
        assert (node["running"], node["waiting"], node["max_running"]) == (2, 1, 2)
        socks.pop().close()  # the queued one hangs up first
        node = _node(slow_node, aborted=1)
        assert (node["aborted_waiting"], node["running"], node["waiting"]) == (1, 2, 0)
    finally:
        for sock in socks:
            sock.close()
    node = _node(slow_node, aborted=3)
    assert (node["aborted_running"], node["aborted_waiting"]) == (2, 1)
    assert (node["running"], node["waiting"], node["completed"]) == (0, 0, 0)


def test_a_prompt_whose_prefix_the_node_saw_reports_cached_tokens() -> None:
    with FakeJudgeServer(FakeJudgeConfig(node=NodeConfig())) as fake:
        status, first = _request(fake, "POST", "/v1/chat/completions", _chat())
        assert status == 200
        status, again = _request(fake, "POST", "/v1/chat/completions", _chat("Paris.", "Nice."))
        assert status == 200
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The shared prefix (the user turn, then response_1) in whole 16-token blocks.
    assert cached > 0 and cached % 16 == 0
    assert cached < again["usage"]["prompt_tokens"]


def test_an_output_length_past_the_budget_is_cut_there_as_finish_reason_length() -> None:
    node = NodeConfig(output_tokens="bimodal:20:budget:1.0")
    with FakeJudgeServer(FakeJudgeConfig(node=node)) as fake:
        status, answer = _request(fake, "POST", "/v1/chat/completions", _chat(max_tokens=50))
    assert status == 200
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 50


def test_sick_modes_and_served_models_switch_at_run_time() -> None:
    with FakeJudgeServer(FakeJudgeConfig(node=NodeConfig())) as fake:
        assert _request(fake, "POST", "/v1/chat/completions", _chat())[0] == 200
        assert _request(fake, "POST", "/control", {"mode": "503"})[0] == 200
        assert _request(fake, "POST", "/v1/chat/completions", _chat())[0] == 503
        assert _request(fake, "GET", "/health")[0] == 503
        assert _request(fake, "POST", "/control", {"mode": "ok", "models": ["other"]})[0] == 200
        assert _request(fake, "GET", "/health")[0] == 200
        _, models = _request(fake, "GET", "/v1/models")
        assert [m["id"] for m in models["data"]] == ["other"]
        assert _request(fake, "POST", "/v1/chat/completions", _chat())[0] == 404
        assert _request(fake, "POST", "/control", {"mode": "sideways"})[0] == 400


def test_hang_mode_accepts_and_never_answers_until_the_client_hangs_up() -> None:
    with FakeJudgeServer(FakeJudgeConfig(node=NodeConfig(mode="hang"))) as fake:
        sock = _open_request(fake, _chat())
        node = _node(fake, hung=1)
        assert node["hung"] == 1 and node["completed"] == 0
        sock.close()
        assert _node(fake, aborted=1)["aborted"] == 1


def test_metrics_use_vllms_names_and_count_what_the_node_did() -> None:
    with FakeJudgeServer(FakeJudgeConfig(node=NodeConfig())) as fake:
        for _ in range(2):
            assert _request(fake, "POST", "/v1/chat/completions", _chat())[0] == 200
        status, text = _request(fake, "GET", "/metrics")
    assert status == 200
    samples = {
        line.split("{")[0].split(" ")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert samples[gauge] == 0
    assert 0 <= samples["vllm:kv_cache_usage_perc"] <= 1
    assert samples["vllm:prompt_tokens_total"] > 0
    assert samples["vllm:generation_tokens_total"] > 0
    assert samples["vllm:prefix_cache_hits_total"] > 0
    assert "simulated" in text
