"""The fake judge (a test double) over real loopback HTTP: answers, faults, counters, CLI."""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from genrm_grpc.scoring.verdict import parse_verdict
from genrm_grpc.testing import (
    FakeJudgeConfig,
    FakeJudgeServer,
    fake_score,
    fake_verdict,
    pair_key,
    parse_latency_spec,
)
from genrm_grpc.testing.cli import main
from genrm_grpc.testing.faults import ADVERSARIAL_KINDS, adversarial_text

PROMPT = "What is the capital of France?"
GOOD = "The capital of France is Paris, a city on the Seine."
SHORT = "Paris."


@pytest.fixture
def server() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer() as fake:
        yield fake


def _post(
    fake: FakeJudgeServer, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(fake.host, fake.port, timeout=10)
    try:
        payload = json.dumps(body).encode()
        connection.request(
            "POST", path, payload, {"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _get(fake: FakeJudgeServer, path: str) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(fake.host, fake.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def _responses_body(response_1: str, response_2: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "genrm",
        "input": [{"role": "user", "content": PROMPT}],
        "metadata": {"response_1": response_1, "response_2": response_2},
        **extra,
    }


def _chat_body(response_1: str, response_2: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "genrm",
        "messages": [
            {"role": "user", "content": PROMPT},
            {"role": "response_1", "content": response_1},
            {"role": "response_2", "content": response_2},
        ],
        **extra,
    }


def _output_text(answer: dict[str, Any]) -> str:
    message = next(item for item in answer["output"] if item["type"] == "message")
    return "".join(part["text"] for part in message["content"])


def test_responses_answer_is_a_responses_object_with_a_parseable_verdict(
    server: FakeJudgeServer,
) -> None:
    status, _, raw = _post(server, "/v1/responses", _responses_body(GOOD, "None"))

    assert status == 200
    answer = json.loads(raw)
    assert answer["object"] == "response"
    assert answer["status"] == "completed"
    assert [item["type"] for item in answer["output"]] == ["reasoning", "message"]
    assert answer["output"][0]["summary"][0]["type"] == "summary_text"
    verdict = parse_verdict(_output_text(answer))
    assert verdict is not None
    assert (verdict.score_1, verdict.score_2, verdict.ranking) == fake_verdict(PROMPT, GOOD, "None")
    usage = answer["usage"]
    assert usage["input_tokens"] > 0
    assert usage["output_tokens"] >= usage["output_tokens_details"]["reasoning_tokens"] > 0


def test_chat_answer_carries_the_same_verdict_and_a_stop_finish_reason(
    server: FakeJudgeServer,
) -> None:
    status, _, raw = _post(server, "/v1/chat/completions", _chat_body(GOOD, SHORT))

    assert status == 200
    answer = json.loads(raw)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    verdict = parse_verdict(choice["message"]["content"])
    assert verdict is not None
    assert (verdict.score_1, verdict.score_2, verdict.ranking) == fake_verdict(PROMPT, GOOD, SHORT)
    assert answer["usage"]["prompt_tokens"] > 0
    assert answer["usage"]["completion_tokens"] > 0


def test_same_pair_always_gets_the_same_verdict_text(server: FakeJudgeServer) -> None:
    texts = [
        _output_text(json.loads(_post(server, "/v1/responses", _responses_body(GOOD, SHORT))[2]))
        for _ in range(3)
    ]

    assert texts[0] == texts[1] == texts[2]
    assert server.stats()["pairs"] == {pair_key(GOOD, SHORT): 3}


def test_literal_none_answer_scores_lowest_and_loses_clearly() -> None:
    assert fake_score(PROMPT, "None") == 1
    assert fake_score(PROMPT, "  ") == 1
    assert min(fake_score(PROMPT, answer) for answer in (SHORT, GOOD, "x")) > 1
    score_1, score_2, ranking = fake_verdict(PROMPT, "None", GOOD)
    assert score_1 < score_2
    assert ranking >= 5


def test_verdict_ties_are_broken_stably_per_ordered_pair() -> None:
    first = fake_verdict(PROMPT, "alpha beta", "gamma delta")
    again = fake_verdict(PROMPT, "alpha beta", "gamma delta")

    assert first == again
    assert first[0] == first[1]
    assert first[2] in (3, 4)


def test_stats_count_every_request_by_endpoint_outcome_and_pair(server: FakeJudgeServer) -> None:
    server.set_faults(fail_503_first_n=1)
    _post(server, "/v1/responses", _responses_body(GOOD, SHORT))
    _post(server, "/v1/responses", _responses_body(GOOD, SHORT))
    _post(server, "/v1/chat/completions", _chat_body(SHORT, GOOD))
    _post(server, "/v1/responses", {"input": "no metadata"})

    status, stats = _get(server, "/stats")

    assert status == 200
    assert stats["total"] == 4
    assert stats["by_endpoint"] == {"responses": 3, "chat_completions": 1}
    assert stats["by_outcome"] == {"fail_503": 2, "ok": 1, "bad_request": 1}
    assert stats["pairs"] == {pair_key(GOOD, SHORT): 2, pair_key(SHORT, GOOD): 1}


def test_stats_reset_zeroes_counters_and_restarts_first_n(server: FakeJudgeServer) -> None:
    server.set_faults(fail_503_first_n=1)
    assert _post(server, "/v1/responses", _responses_body(GOOD, SHORT))[0] == 503
    assert _post(server, "/v1/responses", _responses_body(GOOD, SHORT))[0] == 200

    status, _, raw = _post(server, "/stats/reset", {})

    assert status == 200
    assert json.loads(raw)["total"] == 0
    assert server.stats()["pairs"] == {}
    assert _post(server, "/v1/responses", _responses_body(GOOD, SHORT))[0] == 503


def test_health_endpoint_answers_ok(server: FakeJudgeServer) -> None:
    assert _get(server, "/health") == (200, {"status": "ok"})


def test_faults_endpoint_changes_rates_on_a_running_server(server: FakeJudgeServer) -> None:
    assert _post(server, "/v1/responses", _responses_body(GOOD, SHORT))[0] == 200

    status, _, raw = _post(server, "/faults", {"fail-503-rate": 1.0})

    assert status == 200
    assert json.loads(raw)["fail_503_rate"] == 1.0
    assert _post(server, "/v1/responses", _responses_body(GOOD, SHORT))[0] == 503


@pytest.mark.parametrize(
    "change",
    [{"fail_503_rate": 1.5}, {"no_such_fault": 1}, {"malformed_first_n": -1}, {"port": 1}],
)
def test_faults_endpoint_rejects_unknown_or_out_of_range_settings(
    server: FakeJudgeServer, change: dict[str, Any]
) -> None:
    status, _, raw = _post(server, "/faults", change)

    assert status == 400
    assert "error" in json.loads(raw)
    assert server.stats()["faults"]["fail_503_rate"] == 0.0


def test_first_n_faults_apply_to_each_answer_pair_separately(server: FakeJudgeServer) -> None:
    server.set_faults(fail_503_first_n=1)

    statuses = [
        _post(server, "/v1/responses", _responses_body(a, b))[0]
        for a, b in [(GOOD, SHORT), (SHORT, GOOD), (GOOD, SHORT), (SHORT, GOOD)]
    ]

    assert statuses == [503, 503, 200, 200]


def test_same_seed_and_request_order_reproduce_the_same_faults() -> None:
    def run(seed: int) -> list[int]:
        config = FakeJudgeConfig(seed=seed, fail_503_rate=0.5, latency_ms="uniform:0:1")
        with FakeJudgeServer(config) as fake:
            return [
                _post(fake, "/v1/responses", _responses_body(GOOD, str(i)))[0] for i in range(24)
            ]

    first, second, other = run(7), run(7), run(8)

    assert first == second
    assert set(first) == {200, 503}
    assert first != other


def test_429_carries_the_configured_retry_after_header() -> None:
    with FakeJudgeServer(FakeJudgeConfig(fail_429_rate=1.0, retry_after_s=2.5)) as fake:
        status, headers, _ = _post(fake, "/v1/responses", _responses_body(GOOD, SHORT))

    assert status == 429
    assert headers["Retry-After"] == "3"


def test_budget_exhaust_answers_look_like_an_output_budget_cut() -> None:
    with FakeJudgeServer(FakeJudgeConfig(budget_exhaust_rate=1.0)) as fake:
        _, _, raw = _post(
            fake, "/v1/responses", _responses_body(GOOD, SHORT, max_output_tokens=256)
        )
        responses_answer = json.loads(raw)
        _, _, raw = _post(fake, "/v1/chat/completions", _chat_body(GOOD, SHORT))
        chat_answer = json.loads(raw)

    assert responses_answer["status"] == "incomplete"
    assert responses_answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert responses_answer["usage"]["output_tokens"] == 256
    assert parse_verdict(_output_text(responses_answer)) is None
    assert chat_answer["choices"][0]["finish_reason"] == "length"


def test_malformed_and_empty_answers_hold_no_verdict() -> None:
    with FakeJudgeServer(FakeJudgeConfig(malformed_first_n=1, empty_first_n=0)) as fake:
        _, _, raw = _post(fake, "/v1/responses", _responses_body(GOOD, SHORT))
        malformed = _output_text(json.loads(raw))
        fake.set_faults(empty_rate=1.0)
        _, _, raw = _post(fake, "/v1/responses", _responses_body(GOOD, SHORT))
        empty = _output_text(json.loads(raw))

    assert malformed.strip()
    assert parse_verdict(malformed) is None
    assert empty == ""


def test_unknown_model_gets_404_when_a_model_is_configured() -> None:
    with FakeJudgeServer(FakeJudgeConfig(model="genrm-real")) as fake:
        status, _, raw = _post(fake, "/v1/responses", _responses_body(GOOD, SHORT))

    assert status == 404
    assert "does not exist" in json.loads(raw)["error"]["message"]


def _raw_exchange(fake: FakeJudgeServer) -> tuple[socket.socket, bytes]:
    payload = json.dumps(_responses_body(GOOD, SHORT)).encode()
    request = (
        b"POST /v1/responses HTTP/1.1\r\nHost: judge\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    sock = socket.create_connection((fake.host, fake.port), timeout=10)
    sock.sendall(request)
    return sock, request


class _Noted(logging.Handler):
    def __init__(self, words: str) -> None:
        super().__init__(logging.DEBUG)
        self.words, self.seen = words, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.seen.set()


def test_a_client_that_hangs_up_mid_request_prints_no_traceback_and_serving_goes_on(
    server: FakeJudgeServer, capfd: pytest.CaptureFixture[str]
) -> None:
    noted = _Noted("went away mid-request")
    log = logging.getLogger("genrm_grpc.testing.server")
    log.addHandler(noted)
    level = log.level
    log.setLevel(logging.DEBUG)
    try:
        sock = socket.create_connection((server.host, server.port), timeout=10)
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: judge\r\nContent-Length: 999\r\n\r\n{")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset with the body half sent, as a cancelled judge call does
        assert noted.seen.wait(10)
    finally:
        log.removeHandler(noted)
        log.setLevel(level)
    assert "Traceback" not in capfd.readouterr().err
    status, _, _ = _post(server, "/v1/responses", _responses_body(GOOD, SHORT))
    assert status == 200


def test_reset_fault_aborts_the_connection_without_a_response() -> None:
    with FakeJudgeServer(FakeJudgeConfig(reset_rate=1.0)) as fake:
        sock, _ = _raw_exchange(fake)
        with sock, pytest.raises(ConnectionResetError):
            sock.recv(65536)


def test_truncate_fault_sends_half_the_promised_body_then_closes() -> None:
    with FakeJudgeServer(FakeJudgeConfig(truncate_rate=1.0)) as fake:
        sock, _ = _raw_exchange(fake)
        received = b""
        with sock:
            while chunk := sock.recv(65536):
                received += chunk

    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert head.startswith(b"HTTP/1.1 200")
    assert 0 < len(body) < length


def test_hang_fault_holds_the_request_until_stop_and_stop_is_prompt() -> None:
    fake = FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)).start()
    sock, _ = _raw_exchange(fake)
    with sock:
        assert fake.wait_for_requests(1, timeout=10)
        started = time.monotonic()
        fake.stop()
        stopped_in = time.monotonic() - started
        assert sock.recv(65536) == b""
    assert stopped_in < 2.0


def test_latency_specs_parse_and_invalid_specs_are_rejected() -> None:
    import random

    rng = random.Random(0)
    assert parse_latency_spec("25")(rng) == 25.0
    assert 5.0 <= parse_latency_spec("uniform:5:10")(rng) <= 10.0
    assert parse_latency_spec("lognormal:20:0")(rng) == pytest.approx(20.0)
    for bad in ("", "fast", "uniform:10:5", "lognormal:1", "-3", "uniform:nan:1"):
        with pytest.raises(ValueError):
            parse_latency_spec(bad)


def test_main_rejects_invalid_flags_with_usage_error() -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["--fail-503-rate", "2"])
    assert excinfo.value.code == 2


def test_cli_prints_its_url_answers_and_exits_zero_on_sigterm() -> None:
    code = "from genrm_grpc.testing.cli import main; main(['--port', '0', '--seed', '3'])"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            prefix = "fake-judge listening on http://"
            assert line.startswith(prefix), line
            host, port = line[len(prefix) :].rsplit(":", 1)
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            payload = json.dumps(_chat_body(GOOD, SHORT))
            connection.request(
                "POST", "/v1/chat/completions", payload, {"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["object"] == "chat.completion"
            connection.close()

            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=10)
            assert process.returncode == 0, stderr
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.mark.parametrize("kind", ADVERSARIAL_KINDS)
def test_adversarial_answers_are_completed_answers_of_the_chosen_kind_without_a_verdict(
    kind: str,
) -> None:
    config = FakeJudgeConfig(adversarial_first_n=1, adversarial_kind=kind, adversarial_chars=4096)
    with FakeJudgeServer(config) as fake:
        status, _, raw = _post(fake, "/v1/responses", _responses_body(GOOD, SHORT))
        chat_status, _, chat_raw = _post(fake, "/v1/chat/completions", _chat_body(SHORT, GOOD))
        stats = fake.stats()

    assert status == chat_status == 200
    answer = json.loads(raw)
    assert answer["status"] == "completed"
    text = _output_text(answer)
    chat_text = json.loads(chat_raw)["choices"][0]["message"]["content"]
    assert text == chat_text == adversarial_text(kind, 4096)
    assert len(text) == 4096
    assert parse_verdict(text) is None
    assert stats["by_outcome"] == {"adversarial": 2}


def test_adversarial_kinds_cycle_by_request_number_by_default() -> None:
    with FakeJudgeServer(FakeJudgeConfig(adversarial_rate=1.0, adversarial_chars=64)) as fake:
        texts = [
            _output_text(json.loads(_post(fake, "/v1/responses", _responses_body(GOOD, str(i)))[2]))
            for i in range(5)
        ]

    assert texts[0] == "```json" + " " * 57
    assert texts[1] == "{" * 64
    assert texts[2] == '{"' * 32
    assert texts[3] == ('{"\\"{' * 13)[:64]
    assert texts[4] == texts[0]


def test_adversarial_settings_change_at_runtime_and_bad_ones_are_refused(
    server: FakeJudgeServer,
) -> None:
    status, _, raw = _post(
        server,
        "/faults",
        {"adversarial-first-n": 1, "adversarial_kind": "open_braces", "adversarial_chars": 100},
    )
    assert status == 200
    assert json.loads(raw)["adversarial_kind"] == "open_braces"
    _, _, answer = _post(server, "/v1/responses", _responses_body(GOOD, SHORT))
    assert _output_text(json.loads(answer)) == "{" * 100

    for bad in ({"adversarial_kind": "evil"}, {"adversarial_chars": 3}):
        status, _, _ = _post(server, "/faults", bad)
        assert status == 400
    with pytest.raises(SystemExit) as excinfo:
        main(["--adversarial-kind", "evil"])
    assert excinfo.value.code == 2


def test_adding_the_adversarial_fault_kept_the_fault_sequence_of_every_seed() -> None:
    # The ten original fault kinds still take one draw each, in order, from
    # random.Random(seed); the adversarial draw comes from a stream of its own.
    rng = random.Random(11)
    expected = []
    for _ in range(24):
        draws = [rng.random() for _ in range(10)]
        expected.append(503 if draws[4] < 0.5 else 200)
    config = FakeJudgeConfig(seed=11, fail_503_rate=0.5, adversarial_rate=0.0)
    with FakeJudgeServer(config) as fake:
        served = [_post(fake, "/v1/responses", _responses_body(GOOD, str(i)))[0] for i in range(24)]

    assert served == expected


def test_cli_defaults_meet_the_servers_judge_url_and_model_defaults() -> None:
    from urllib.parse import urlsplit

    from genrm_grpc.config import JudgeSettings
    from genrm_grpc.testing.cli import _build_parser, _config_from_args

    config = _config_from_args(_build_parser().parse_args([]))
    judge = JudgeSettings()

    assert config.port == urlsplit(judge.url).port == 8000
    assert config.served_models() == (judge.model,)
    assert config.checks_model()


def test_models_endpoint_lists_every_served_name_and_other_names_get_404() -> None:
    with FakeJudgeServer(FakeJudgeConfig(models=("genrm", "genrm-large"))) as fake:
        status, listing = _get(fake, "/v1/models")
        served, _, _ = _post(fake, "/v1/chat/completions", _chat_body(GOOD, SHORT))
        other, _, _ = _post(
            fake, "/v1/chat/completions", {**_chat_body(GOOD, SHORT), "model": "typo"}
        )

    assert status == 200
    assert listing["object"] == "list"
    assert [entry["id"] for entry in listing["data"]] == ["genrm", "genrm-large"]
    assert {entry["object"] for entry in listing["data"]} == {"model"}
    assert (served, other) == (200, 404)


def test_models_endpoint_of_an_unconfigured_fake_lists_the_default_model(
    server: FakeJudgeServer,
) -> None:
    status, listing = _get(server, "/v1/models")

    assert status == 200
    assert [entry["id"] for entry in listing["data"]] == ["genrm"]


def test_cli_on_a_busy_port_prints_one_line_and_exits_2() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "genrm_grpc.cli", "fake-judge", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
