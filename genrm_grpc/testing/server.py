"""The fake judge: a TEST DOUBLE for an OpenAI-compatible GenRM server. It is not a model.

It exists so that tests, benchmarks and demos can exercise the judge client and the
cohort server over real HTTP (loopback TCP) without a GPU, and can inject the failures a
real judge deployment produces. It serves both wire formats of PROTOCOL.md "Judging":

* ``POST /v1/responses`` — ``input`` is the conversation, ``metadata`` carries
  ``response_1``, ``response_2`` and optionally ``principle`` (NeMo Gym's GenRM model
  server shape). Answers are Responses-API objects: a ``reasoning`` item with a summary,
  then a ``message`` with one ``output_text`` part, plus ``usage``.
* ``POST /v1/chat/completions`` — the conversation followed by messages of role
  ``principle`` (optional), ``response_1`` and ``response_2`` (vLLM serving the GenRM chat
  template). Answers are chat completions with ``finish_reason`` and ``usage``.

Also: ``GET /health``, ``GET /stats``, ``POST /stats/reset`` and ``POST /faults``.

The verdict heuristic (deterministic; the same request always gets the same verdict)
-----------------------------------------------------------------------------------
Words are runs of ``[a-z0-9]`` in the lower-cased text. For each answer:

* a blank answer or the literal ``None`` (GenRM's placeholder for an empty answer)
  scores 1, the lowest score;
* otherwise ``overlap`` = the share of distinct words of the last user turn that the
  answer also uses, ``length`` = min(word count, 60) / 60, and the score is
  ``2 + min(3, floor(4 * (overlap + length) / 2))``, i.e. 2..5.

The ranking (1 = response 1 much better ... 6 = response 2 much better) comes from
``d = score_1 - score_2``: d ≥ 2 → 1, d = 1 → 2, d = 0 → 3 or 4, d = -1 → 5, d ≤ -2 → 6.
A tie is broken by the parity of the first byte of ``sha256(response_1 + "\\0" +
response_2)``, so it is stable for a pair but may differ when the pair is swapped (a
little position bias, as real judges have). The principle is accepted and ignored.
The answer is short prose followed by a fenced ```` ```json ```` block
``{"score_1": s1, "score_2": s2, "ranking": r}``.

Faults
------
Each judge request draws, from one ``random.Random(seed)`` under a lock, a latency and
one uniform number per fault kind, always in the same order, so a given seed and request
order reproduce the same sequence of faults. Fault kinds in precedence order (the first
that fires wins): ``hang`` (never answer until the server stops), ``reset`` (abort the TCP
connection: SO_LINGER 0, then close), ``truncate`` (headers with the full
Content-Length, then half the body, then close), ``fail_400``, ``fail_503``, ``fail_429``
(with ``Retry-After`` when ``retry_after_s`` is set; whole seconds, rounded up),
``invalid_json`` (a 200 whose body is not JSON), ``budget_exhaust`` (``status:
incomplete`` with ``incomplete_details.reason = max_output_tokens`` and partial text; in
chat: ``finish_reason: length``), ``empty`` (a completed answer with no text) and
``malformed`` (a completed answer in prose without any JSON verdict).

Each kind has a rate in [0, 1] (``--fail-503-rate``) and a deterministic ``first_n``
(``--fail-503-first-n``): the first N requests *of each answer pair* get that fault.
``first_n`` faults are checked before the random ones. With ``--model`` set, a request
naming another model gets 404 (as vLLM answers) before any fault is considered. Latency is a spec in
milliseconds: ``N`` (fixed), ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA``
(``MEDIAN * exp(SIGMA * z)`` with z standard normal). Rates, first-n counts, latency and
``retry_after_s`` can be changed at runtime with ``POST /faults`` (a JSON object of
``FakeJudgeConfig`` field names) or ``FakeJudgeServer.set_faults``.

Counters
--------
Every judge request is counted: ``total``, ``by_endpoint``, ``by_outcome`` (``ok`` or the
fault kind, ``bad_request``, ``model_not_found``) and ``pairs`` keyed by
``pair_key(response_1, response_2)`` (the first 16 hex digits of
``sha256(response_1 + "\\0" + response_2)``). ``last_authorization`` and a summary of the
last request are kept for tests. ``GET /stats`` returns them; ``POST /stats/reset`` zeroes
them (which also restarts every pair's ``first_n`` count).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import math
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from types import FrameType, TracebackType
from typing import Any, Self

logger = logging.getLogger(__name__)

FAULT_KINDS: tuple[str, ...] = (
    "hang",
    "reset",
    "truncate",
    "fail_400",
    "fail_503",
    "fail_429",
    "invalid_json",
    "budget_exhaust",
    "empty",
    "malformed",
)
"""Fault kinds in precedence order: when several fire for one request, the first wins."""

_FAULT_HELP = {
    "hang": "accept the request and never answer until the server stops",
    "reset": "abort the TCP connection (SO_LINGER 0, close) without a response",
    "truncate": "send headers with the full Content-Length, then half the body, then close",
    "fail_400": "answer HTTP 400 (not retryable)",
    "fail_503": "answer HTTP 503",
    "fail_429": "answer HTTP 429 with Retry-After (see --retry-after-s)",
    "invalid_json": "answer HTTP 200 with a body that is not JSON",
    "budget_exhaust": "answer an incomplete (max_output_tokens) / finish_reason=length answer",
    "empty": "answer a completed answer with empty text",
    "malformed": "answer a completed answer in prose without a JSON verdict",
}

_WORD = re.compile(r"[a-z0-9]+")
_LENGTH_SATURATION_WORDS = 60


def pair_key(response_1: str, response_2: str) -> str:
    """The fake judge's counter key for an ordered answer pair."""
    digest = hashlib.sha256((response_1 + "\x00" + response_2).encode("utf-8"))
    return digest.hexdigest()[:16]


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def fake_score(last_user_turn: str, answer: str) -> int:
    """The fake judge's 1..5 score for one answer (see the module docstring)."""
    stripped = answer.strip()
    if not stripped or stripped == "None":
        return 1
    words = _words(answer)
    prompt_words = set(_words(last_user_turn))
    overlap = len(prompt_words & set(words)) / len(prompt_words) if prompt_words else 0.0
    length = min(len(words), _LENGTH_SATURATION_WORDS) / _LENGTH_SATURATION_WORDS
    return 2 + min(3, math.floor(4 * (overlap + length) / 2))


def fake_verdict(last_user_turn: str, response_1: str, response_2: str) -> tuple[int, int, int]:
    """The fake judge's ``(score_1, score_2, ranking)`` for an ordered pair."""
    score_1 = fake_score(last_user_turn, response_1)
    score_2 = fake_score(last_user_turn, response_2)
    diff = score_1 - score_2
    if diff >= 2:
        ranking = 1
    elif diff == 1:
        ranking = 2
    elif diff == 0:
        first_byte = hashlib.sha256((response_1 + "\x00" + response_2).encode("utf-8")).digest()[0]
        ranking = 3 if first_byte % 2 == 0 else 4
    elif diff == -1:
        ranking = 5
    else:
        ranking = 6
    return score_1, score_2, ranking


def verdict_text(last_user_turn: str, response_1: str, response_2: str) -> str:
    """The fake judge's full answer text: prose, then a fenced JSON verdict."""
    score_1, score_2, ranking = fake_verdict(last_user_turn, response_1, response_2)
    verdict = json.dumps({"score_1": score_1, "score_2": score_2, "ranking": ranking})
    return (
        "Fake judge (a deterministic test double, not a model). "
        f"Response 1 has {len(_words(response_1))} words and response 2 has "
        f"{len(_words(response_2))}; scores come from word overlap with the last user "
        "turn plus a length term.\n"
        f"```json\n{verdict}\n```"
    )


_REASONING_SUMMARY = (
    "Heuristic: share of the last user turn's words reused by each answer, plus a "
    "length term, bucketed into scores 1 to 5."
)
_MALFORMED_TEXT = (
    "Having weighed both answers, response 1 seems a little more helpful than "
    "response 2, though neither is perfect. Scores: undecided."
)
_PARTIAL_TEXT = "Let me compare the two responses carefully. Response 1 begins by"


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def parse_latency_spec(spec: str) -> Callable[[random.Random], float]:
    """A latency sampler (milliseconds) from ``N``, ``uniform:LO:HI`` or ``lognormal:M:S``."""
    text = spec.strip()
    try:
        if ":" not in text:
            fixed = float(text)
            _check_latency(fixed, spec)
            return lambda _rng: fixed
        kind, *params = text.split(":")
        values = [float(p) for p in params]
        if kind == "uniform" and len(values) == 2:
            low, high = values
            _check_latency(low, spec)
            _check_latency(high, spec)
            if high < low:
                raise ValueError
            return lambda rng: rng.uniform(low, high)
        if kind == "lognormal" and len(values) == 2:
            median, sigma = values
            _check_latency(median, spec)
            _check_latency(sigma, spec)
            return lambda rng: median * math.exp(sigma * rng.gauss(0.0, 1.0))
    except ValueError:
        pass
    raise ValueError(
        f"latency spec {spec!r} must be N, uniform:LO:HI or lognormal:MEDIAN:SIGMA "
        "(milliseconds, finite and >= 0)"
    )


def _check_latency(value: float, spec: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(spec)


@dataclass(frozen=True)
class FakeJudgeConfig:
    """Every knob of the fake judge. Fields ending in ``_rate``/``_first_n`` are faults."""

    host: str = "127.0.0.1"
    port: int = 0
    seed: int = 0
    model: str | None = None
    """When set, requests naming another model get 404 (as vLLM does)."""
    latency_ms: str = "0"
    retry_after_s: float | None = 1.0
    hang_rate: float = 0.0
    hang_first_n: int = 0
    reset_rate: float = 0.0
    reset_first_n: int = 0
    truncate_rate: float = 0.0
    truncate_first_n: int = 0
    fail_400_rate: float = 0.0
    fail_400_first_n: int = 0
    fail_503_rate: float = 0.0
    fail_503_first_n: int = 0
    fail_429_rate: float = 0.0
    fail_429_first_n: int = 0
    invalid_json_rate: float = 0.0
    invalid_json_first_n: int = 0
    budget_exhaust_rate: float = 0.0
    budget_exhaust_first_n: int = 0
    empty_rate: float = 0.0
    empty_first_n: int = 0
    malformed_rate: float = 0.0
    malformed_first_n: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for kind in FAULT_KINDS:
            rate = getattr(self, f"{kind}_rate")
            if isinstance(rate, bool) or not isinstance(rate, int | float):
                raise ValueError(f"{kind}_rate must be a number, got {rate!r}")
            if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
                raise ValueError(f"{kind}_rate must be in [0, 1], got {rate!r}")
            first_n = getattr(self, f"{kind}_first_n")
            if isinstance(first_n, bool) or not isinstance(first_n, int) or first_n < 0:
                raise ValueError(f"{kind}_first_n must be an integer >= 0, got {first_n!r}")
        retry_after = self.retry_after_s
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, int | float)
            or not (math.isfinite(retry_after) and retry_after >= 0)
        ):
            raise ValueError(f"retry_after_s must be finite and >= 0, got {retry_after!r}")
        if not isinstance(self.latency_ms, str):
            raise ValueError(f"latency_ms must be a spec string, got {self.latency_ms!r}")
        parse_latency_spec(self.latency_ms)

    def faults(self) -> dict[str, Any]:
        """The runtime-adjustable part of the configuration."""
        return {name: getattr(self, name) for name in RUNTIME_FIELDS}


RUNTIME_FIELDS: tuple[str, ...] = (
    "latency_ms",
    "retry_after_s",
    *(f"{kind}_{suffix}" for kind in FAULT_KINDS for suffix in ("rate", "first_n")),
)
"""Fields that ``POST /faults`` and ``FakeJudgeServer.set_faults`` may change."""


# --------------------------------------------------------------------------------------
# Shared state
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    endpoint: str
    model: str | None
    last_user_turn: str
    response_1: str
    response_2: str
    principle: str | None
    max_tokens: int | None
    roles: tuple[str, ...]
    input_words: int


class _State:
    """Counters, fault settings and the random stream, shared by handler threads."""

    def __init__(self, config: FakeJudgeConfig) -> None:
        self.lock = threading.Lock()
        self.counted = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.config = config
        self.latency = parse_latency_spec(config.latency_ms)
        self.rng = random.Random(config.seed)
        self.total = 0
        self.by_endpoint: Counter[str] = Counter()
        self.by_outcome: Counter[str] = Counter()
        self.pairs: Counter[str] = Counter()
        self.last_authorization: str | None = None
        self.last_request: dict[str, Any] | None = None

    def set_faults(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(changes) - set(RUNTIME_FIELDS))
        if unknown:
            raise ValueError(f"unknown fault settings {unknown}; known: {list(RUNTIME_FIELDS)}")
        with self.lock:
            config = dataclasses.replace(self.config, **changes)
            self.config = config
            self.latency = parse_latency_spec(config.latency_ms)
            return config.faults()

    def record(self, endpoint: str, outcome: str, authorization: str | None) -> None:
        """Count a request that never got far enough to name a pair."""
        with self.lock:
            self.total += 1
            self.by_endpoint[endpoint] += 1
            self.by_outcome[outcome] += 1
            self.last_authorization = authorization
            self.counted.notify_all()

    def decide(self, request: _Request, authorization: str | None) -> tuple[str, float, int]:
        """Count the request and choose its fate: (outcome, latency seconds, sequence)."""
        with self.lock:
            config = self.config
            self.total += 1
            self.by_endpoint[request.endpoint] += 1
            key = pair_key(request.response_1, request.response_2)
            self.pairs[key] += 1
            nth_for_pair = self.pairs[key]
            self.last_authorization = authorization
            self.last_request = {
                "endpoint": request.endpoint,
                "model": request.model,
                "roles": list(request.roles),
                "pair": key,
                "principle": request.principle,
                "max_tokens": request.max_tokens,
            }
            # Always consume the same number of draws so the sequence depends only on
            # the seed and the request order, not on which faults are switched on.
            latency_s = max(0.0, self.latency(self.rng)) / 1000.0
            draws = [self.rng.random() for _ in FAULT_KINDS]
            outcome = "ok"
            if config.model is not None and request.model != config.model:
                outcome = "model_not_found"
            else:
                for kind in FAULT_KINDS:
                    if nth_for_pair <= getattr(config, f"{kind}_first_n"):
                        outcome = kind
                        break
                else:
                    for kind, draw in zip(FAULT_KINDS, draws, strict=True):
                        if draw < getattr(config, f"{kind}_rate"):
                            outcome = kind
                            break
            self.by_outcome[outcome] += 1
            self.counted.notify_all()
            return outcome, latency_s, self.total

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "total": self.total,
                "by_endpoint": dict(self.by_endpoint),
                "by_outcome": dict(self.by_outcome),
                "pairs": dict(self.pairs),
                "last_authorization": self.last_authorization,
                "last_request": dict(self.last_request) if self.last_request else None,
                "faults": self.config.faults(),
            }

    def reset(self) -> None:
        with self.lock:
            self.total = 0
            self.by_endpoint.clear()
            self.by_outcome.clear()
            self.pairs.clear()
            self.last_authorization = None
            self.last_request = None


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------


class _BadRequest(Exception):
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


def _parse_judge_request(endpoint: str, body: object) -> _Request:
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
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
            raise _BadRequest("'input' must be a string or a list of messages")
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            raise _BadRequest("'metadata' with response_1 and response_2 is required")
        response_1 = metadata.get("response_1")
        response_2 = metadata.get("response_2")
        raw_principle = metadata.get("principle")
        principle = raw_principle if isinstance(raw_principle, str) else None
        roles = tuple(role for role, _ in conversation)
        max_tokens = body.get("max_output_tokens")
    else:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise _BadRequest("'messages' must be a list")
        role_list: list[str] = []
        for item in messages:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise _BadRequest("every message needs a string 'role'")
            role, text = item["role"], _text_of(item.get("content"))
            role_list.append(role)
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
        raise _BadRequest("both response_1 and response_2 are required")
    last_user = next((text for role, text in reversed(conversation) if role == "user"), "")
    all_text = " ".join([*(text for _, text in conversation), response_1, response_2])
    return _Request(
        endpoint=endpoint,
        model=model,
        last_user_turn=last_user,
        response_1=response_1,
        response_2=response_2,
        principle=principle,
        max_tokens=max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None,
        roles=roles,
        input_words=len(_words(all_text + " " + (principle or ""))),
    )


def _answer_body(request: _Request, outcome: str, sequence: int) -> dict[str, Any]:
    """The JSON answer for a 200 outcome: ok, budget_exhaust, empty or malformed."""
    reasoning = _REASONING_SUMMARY
    if outcome == "budget_exhaust":
        text = _PARTIAL_TEXT
    elif outcome == "empty":
        text = ""
    elif outcome == "malformed":
        text = _MALFORMED_TEXT
    else:
        text = verdict_text(request.last_user_turn, request.response_1, request.response_2)
    reasoning_tokens = len(_words(reasoning))
    output_tokens = reasoning_tokens + len(_words(text))
    if outcome == "budget_exhaust":
        output_tokens = max(output_tokens, request.max_tokens or 4096)
        reasoning_tokens = output_tokens - len(_words(text))
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
                "input_tokens": request.input_words,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": request.input_words + output_tokens,
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
            "prompt_tokens": request.input_words,
            "completion_tokens": output_tokens,
            "total_tokens": request.input_words + output_tokens,
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        },
    }


def _error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


class _FakeJudgeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when a server opens its
    # whole judge pool at once; a real judge would not, so neither should its double.
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN of the host, which can stall on
        # machines without working reverse DNS; the name is never used here.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Wake idle keep-alive handlers so that stopping does not wait on clients."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK (~40 ms per call), which would swamp every latency we measure.
    disable_nagle_algorithm = True
    server_version = "fake-genrm-judge/1"

    @property
    def _state(self) -> _State:
        server = self.server
        assert isinstance(server, _FakeJudgeHTTPServer)
        return server.state

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - " + format, self.address_string(), *args)

    # -- routing --------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send_json(200, {"status": "ok"})
        elif path == "/stats":
            self._send_json(200, self._state.snapshot())
        else:
            self._send_json(404, _error_body(f"no route GET {path}", "not_found", 404))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        raw = self._read_body()
        if path == "/v1/responses":
            self._judge("responses", raw)
        elif path == "/v1/chat/completions":
            self._judge("chat_completions", raw)
        elif path == "/stats/reset":
            self._state.reset()
            self._send_json(200, self._state.snapshot())
        elif path == "/faults":
            self._faults(raw)
        else:
            self._send_json(404, _error_body(f"no route POST {path}", "not_found", 404))

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _faults(self, raw: bytes) -> None:
        try:
            changes = json.loads(raw or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            changes = {str(k).replace("-", "_"): v for k, v in changes.items()}
            faults = self._state.set_faults(changes)
        except (ValueError, TypeError) as exc:
            self._send_json(400, _error_body(str(exc), "invalid_request_error", 400))
            return
        self._send_json(200, faults)

    # -- judging --------------------------------------------------------------------

    def _judge(self, endpoint: str, raw: bytes) -> None:
        state = self._state
        authorization = self.headers.get("Authorization")
        try:
            request = _parse_judge_request(endpoint, json.loads(raw))
        except (ValueError, _BadRequest) as exc:
            state.record(endpoint, "bad_request", authorization)
            self._send_json(400, _error_body(str(exc), "invalid_request_error", 400))
            return
        outcome, latency_s, sequence = state.decide(request, authorization)
        if latency_s > 0 and state.stopping.wait(latency_s):
            self._drop()
            return
        if outcome == "hang":
            state.stopping.wait()
            self._drop()
        elif outcome == "reset":
            self._reset()
        elif outcome == "model_not_found":
            message = f"The model `{request.model}` does not exist."
            self._send_json(404, _error_body(message, "NotFoundError", 404))
        elif outcome == "fail_400":
            self._send_json(400, _error_body("injected bad request", "BadRequestError", 400))
        elif outcome == "fail_503":
            self._send_json(503, _error_body("injected overload", "ServiceUnavailable", 503))
        elif outcome == "fail_429":
            retry_after = state.config.retry_after_s
            headers = {} if retry_after is None else {"Retry-After": str(math.ceil(retry_after))}
            self._send_json(429, _error_body("injected rate limit", "RateLimitError", 429), headers)
        elif outcome == "invalid_json":
            self._send_bytes(200, b"<html>upstream proxy error</html>", "text/html")
        else:
            body = json.dumps(_answer_body(request, outcome, sequence)).encode("utf-8")
            if outcome == "truncate":
                self._send_truncated(body)
            else:
                self._send_bytes(200, body, "application/json")

    # -- writing --------------------------------------------------------------------

    def _send_json(
        self, status: int, obj: object, headers: Mapping[str, str] | None = None
    ) -> None:
        self._send_bytes(status, json.dumps(obj).encode("utf-8"), "application/json", headers)

    def _send_bytes(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_truncated(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True

    def _drop(self) -> None:
        """Close without answering (a hang released by shutdown)."""
        self.close_connection = True

    def _reset(self) -> None:
        """Abort the connection so the client sees a TCP reset, not an orderly close."""
        self.close_connection = True
        connection = self.connection
        with contextlib.suppress(OSError):
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # The socket is only really closed (and the RST sent) once the reader and
        # writer that wrap it are closed too; inert stand-ins keep the base class's
        # final flush and close harmless.
        self.rfile.close()
        self.wfile.close()
        connection.close()
        self.rfile = io.BytesIO()
        self.wfile = io.BytesIO()


# --------------------------------------------------------------------------------------
# In-process API
# --------------------------------------------------------------------------------------


class FakeJudgeServer:
    """A fake GenRM judge (TEST DOUBLE, not a model) served from a daemon thread.

    ``start()`` binds (port 0 = any free port) and serves; ``url`` is the base URL to
    give the judge client. ``stop()`` releases hung requests and closes connections.
    """

    def __init__(self, config: FakeJudgeConfig | None = None) -> None:
        self._config = config or FakeJudgeConfig()
        self._state = _State(self._config)
        self._httpd: _FakeJudgeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("fake judge already started")
        self._state.stopping.clear()
        httpd = _FakeJudgeHTTPServer((self._config.host, self._config.port), self._state)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-judge:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._state.stopping.set()
        httpd.shutdown()
        httpd.drop_connections()
        httpd.server_close()
        if thread is not None:
            thread.join()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("fake judge not started")
        return int(self._httpd.server_address[1])

    @property
    def host(self) -> str:
        if self._httpd is None:
            raise RuntimeError("fake judge not started")
        return str(self._httpd.server_address[0])

    @property
    def url(self) -> str:
        """Base URL (no ``/v1``), e.g. ``http://127.0.0.1:38123``."""
        return f"http://{self.host}:{self.port}"

    def stats(self) -> dict[str, Any]:
        """The same JSON object that ``GET /stats`` returns."""
        return self._state.snapshot()

    def reset_stats(self) -> None:
        self._state.reset()

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault rates, first-n counts, latency or retry_after_s at runtime."""
        return self._state.set_faults(changes)

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` judge requests were counted (for tests)."""
        state = self._state
        with state.counted:
            return state.counted.wait_for(lambda: state.total >= count, timeout)


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc fake-judge",
        description=(
            "Serve a fake GenRM judge: a deterministic TEST DOUBLE that speaks the "
            "OpenAI-compatible /v1/responses and /v1/chat/completions APIs. It is not a "
            "model: verdicts come from word overlap with the last user turn and answer "
            "length. Faults can be injected to exercise retries and failure handling."
        ),
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free port")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault/latency stream")
    parser.add_argument("--model", default=None, help="if set, other model names get HTTP 404")
    parser.add_argument(
        "--latency-ms",
        default="0",
        help="latency per request: N, uniform:LO:HI or lognormal:MEDIAN:SIGMA (ms)",
    )
    parser.add_argument(
        "--retry-after-s",
        type=float,
        default=1.0,
        help="Retry-After seconds sent with injected 429s (negative: omit the header)",
    )
    for kind in FAULT_KINDS:
        flag = kind.replace("_", "-")
        parser.add_argument(
            f"--{flag}-rate", type=float, default=0.0, help=f"probability to {_FAULT_HELP[kind]}"
        )
        parser.add_argument(
            f"--{flag}-first-n",
            type=int,
            default=0,
            help=f"{_FAULT_HELP[kind]} for the first N requests of each answer pair",
        )
    return parser


def _config_from_args(args: argparse.Namespace) -> FakeJudgeConfig:
    faults: dict[str, Any] = {}
    for kind in FAULT_KINDS:
        faults[f"{kind}_rate"] = getattr(args, f"{kind}_rate")
        faults[f"{kind}_first_n"] = getattr(args, f"{kind}_first_n")
    return FakeJudgeConfig(
        host=args.host,
        port=args.port,
        seed=args.seed,
        model=args.model,
        latency_ms=args.latency_ms,
        retry_after_s=None if args.retry_after_s < 0 else args.retry_after_s,
        **faults,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the fake judge until SIGTERM or SIGINT; prints its URL on one line first."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        config = _config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[signal.Signals, Any] = {}
    if in_main_thread:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    server = FakeJudgeServer(config).start()
    try:
        print(f"fake-judge listening on {server.url}", flush=True)
        stop_requested.wait()
    finally:
        server.stop()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
