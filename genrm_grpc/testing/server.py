"""The fake judge's HTTP server: a TEST DOUBLE for an OpenAI-compatible GenRM server.

It is not a model. It exists so that tests, benchmarks and demos can exercise the judge
client and the cohort server over real HTTP (loopback TCP) without a GPU, and can inject
the failures a real judge deployment produces (see ``genrm_grpc.testing.faults``). It
serves both judge wire formats:

* ``POST /v1/responses`` — ``input`` is the conversation, ``metadata`` carries
  ``response_1``, ``response_2`` and optionally ``principle`` (NeMo Gym's GenRM model
  server shape). Answers are Responses-API objects: a ``reasoning`` item with a summary,
  then a ``message`` with one ``output_text`` part, plus ``usage``.
* ``POST /v1/chat/completions`` — the conversation followed by messages of role
  ``principle`` (optional), ``response_1`` and ``response_2`` (vLLM serving the GenRM chat
  template). Answers are chat completions with ``finish_reason`` and ``usage``.

With ``"stream": true`` either route answers as server-sent events (``_SSEStream``),
its tokens emitted over the node's simulated decode time.

Also: ``GET /v1/models`` (the served model names), ``GET /health``, ``GET /stats``,
``POST /stats/reset`` and ``POST /faults``.


Verdicts come from ``genrm_grpc.testing.heuristic``; ``FakeJudgeServer`` runs the server
in a daemon thread of the calling process, ``genrm-grpc fake-judge``
(``genrm_grpc.testing.cli``) in a process of its own.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import math
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from types import TracebackType
from typing import Any, Self

from genrm_grpc.testing.faults import (
    MALFORMED_TEXT,
    PARTIAL_TEXT,
    FakeJudgeConfig,
    JudgeRequest,
    JudgeState,
    adversarial_text,
)
from genrm_grpc.testing.heuristic import REASONING_SUMMARY, verdict_text, words
from genrm_grpc.testing.node import Plan, Ticket, prompt_tokens

logger = logging.getLogger(__name__)

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


def _parse_judge_request(endpoint: str, body: object) -> JudgeRequest:
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
            raise _BadRequest("'messages' must be a list")
        role_list: list[str] = []
        ordered = []
        for item in messages:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise _BadRequest("every message needs a string 'role'")
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
        raise _BadRequest("both response_1 and response_2 are required")
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


def _answer_body(
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


def _models_body(models: tuple[str, ...]) -> dict[str, Any]:
    """``GET /v1/models`` as vLLM answers it: one ``model`` object per served name."""
    created = int(time.time())
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "fake-judge"}
            for name in models
        ],
    }


def _error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


class _FakeJudgeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when a server opens its
    # whole judge pool at once; a real judge would not, so neither should its double.
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: JudgeState) -> None:
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

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is routine (a cancelled or hedged judge
        call closes its connection): note it at DEBUG. socketserver's default prints a
        traceback on stderr, which lands in the middle of a test run's output."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            logger.debug("client %s went away mid-request: %r", client_address, exc)
        else:
            logger.exception("fake judge: error while serving %s", client_address)

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
    def _state(self) -> JudgeState:
        server = self.server
        assert isinstance(server, _FakeJudgeHTTPServer)
        return server.state

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - " + format, self.address_string(), *args)

    # -- routing --------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._health()
        elif path == "/v1/models":
            self._send_json(200, _models_body(self._state.models))
        elif path == "/stats":
            self._send_json(200, self._state.snapshot())
        elif path == "/metrics":
            text = self._state.node.metrics_text(self._state.models[0])
            self._send_bytes(200, text.encode("utf-8"), "text/plain; version=0.0.4")
        elif path == "/control":
            self._send_json(200, self._state.control_state())
        elif path == "/wait":
            self._wait(self.path.partition("?")[2])
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
        elif path == "/control":
            self._control(raw)
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

    def _control(self, raw: bytes) -> None:
        try:
            changes = json.loads(raw or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            state = self._state.control({str(k).replace("-", "_"): v for k, v in changes.items()})
        except (ValueError, TypeError) as exc:
            self._send_json(400, _error_body(str(exc), "invalid_request_error", 400))
            return
        self._send_json(200, state)

    def _health(self) -> None:
        node = self._state.node
        answer = node.health()
        if answer == "hang":
            ticket = node.admit(self.connection, count=False)
            try:
                while not ticket.done:
                    ticket.wake.wait()
                    ticket.wake.clear()
            finally:
                node.release(ticket, self.connection)
            self._drop()
        elif answer == "503":
            self._send_json(503, {"status": "unhealthy", "mode": node.mode})
        else:
            self._send_json(200, {"status": "ok"})

    def _wait(self, query: str) -> None:
        targets: dict[str, int] = {}
        timeout = 30.0
        try:
            for name, values in urllib.parse.parse_qs(query, strict_parsing=bool(query)).items():
                if name == "timeout":
                    timeout = float(values[-1])
                    if not (math.isfinite(timeout) and 0 <= timeout <= 3600):
                        raise ValueError("timeout must be in [0, 3600] seconds")
                else:
                    targets[name] = int(values[-1])
            met, stats = self._state.node.wait_for(targets, timeout)
        except ValueError as exc:
            self._send_json(400, _error_body(str(exc), "invalid_request_error", 400))
            return
        self._send_json(200 if met else 408, stats)

    # -- judging --------------------------------------------------------------------

    def _judge(self, endpoint: str, raw: bytes) -> None:
        state = self._state
        node = state.node
        authorization = self.headers.get("Authorization")
        try:
            request = _parse_judge_request(endpoint, json.loads(raw))
        except (ValueError, _BadRequest) as exc:
            state.record(endpoint, "bad_request", authorization)
            self._send_json(400, _error_body(str(exc), "invalid_request_error", 400))
            return
        mode = node.mode
        if mode == "503":
            state.record(endpoint, "mode_503", authorization)
            node.count("requests")
            node.count("rejected_503")
            self._send_json(503, _error_body("node in 503 mode", "ServiceUnavailable", 503))
            return
        outcome, latency_s, sequence = state.decide(request, authorization)
        ticket = node.admit(self.connection)
        try:
            self._judge_admitted(request, outcome, latency_s, sequence, ticket, mode)
        finally:
            node.release(ticket, self.connection)

    def _judge_admitted(
        self,
        request: JudgeRequest,
        outcome: str,
        latency_s: float,
        sequence: int,
        ticket: Ticket,
        mode: str,
    ) -> None:
        state = self._state
        node = state.node
        if mode == "hang" or outcome == "hang":
            node.hang(ticket)
            self._drop()
            return
        if mode == "stall":
            # A hung engine behind a live front end: a streamed request gets its
            # headers and the stream's opening event, then nothing.
            if request.stream:
                with contextlib.suppress(OSError):
                    _SSEStream(self, request, sequence).open()
            node.hang(ticket)
            self._drop()
            return
        if latency_s > 0 and not node.wait(ticket, latency_s):
            self._drop()
            return
        if outcome == "reset":
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
        else:
            # Everything that takes a generation: it waits for a slot, then spends its
            # simulated prefill and decode time there.
            if not node.acquire(ticket):
                self._drop()
                return
            plan = node.plan(ticket, prompt_tokens(request.messages), request.max_tokens)
            if plan.truncated and outcome == "ok":
                outcome = "budget_exhaust"
            answer = _answer_body(request, outcome, sequence, state.config, plan)
            usage = answer["usage"]
            produced = int(usage.get("output_tokens", usage.get("completion_tokens", 0)))
            if request.stream and outcome != "invalid_json":
                self._stream_answer(request, outcome, sequence, answer, ticket, plan, produced)
                return
            if not node.generate(ticket, plan, produced):
                self._drop()
                return
            node.release(ticket, self.connection)
            if outcome == "invalid_json":
                self._send_bytes(200, b"<html>upstream proxy error</html>", "text/html")
                return
            body = json.dumps(answer).encode("utf-8")
            if outcome == "truncate":
                self._send_truncated(body)
            else:
                self._send_bytes(200, body, "application/json")

    def _stream_answer(
        self,
        request: JudgeRequest,
        outcome: str,
        sequence: int,
        answer: dict[str, Any],
        ticket: Ticket,
        plan: Plan,
        produced: int,
    ) -> None:
        """The answer as server-sent events, its tokens over the simulated decode time.

        ``truncate`` sends half the tokens and closes without ending the stream."""
        node = self._state.node
        stream = _SSEStream(self, request, sequence)
        try:
            stream.open()
        except OSError:
            self._drop()
            return
        total, events = stream.tokens(answer, produced)
        if outcome == "truncate":
            total //= 2

        def emit(count: int) -> bool:
            try:
                stream.write(b"".join(itertools.islice(events, count)))
            except OSError:
                return False
            return True

        if not node.generate(ticket, plan, total, emit):
            self._drop()
            return
        node.release(ticket, self.connection)
        if outcome == "truncate":
            self.wfile.flush()
            self._drop()
            return
        with contextlib.suppress(OSError):
            stream.finish(answer)

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
# Streamed answers (server-sent events)
# --------------------------------------------------------------------------------------

_PIECE = re.compile(r"\s*\S+|\s+$")
"""An answer's text as stream tokens: each non-blank run with the blanks before it."""


class _SSEStream:
    """One streamed answer in chunked transfer encoding, as vLLM streams both APIs.

    Chat: ``chat.completion.chunk`` objects (an opening role chunk, one per token with
    ``reasoning_content`` or ``content``, one with ``finish_reason``, with
    ``stream_options.include_usage`` one with the usage and no choices), then
    ``data: [DONE]``. Responses: ``response.created``, ``response.reasoning_text.delta``
    and ``response.output_text.delta`` events, then ``response.completed`` (or
    ``response.incomplete``) carrying the whole response object, usage included: the
    same object the non-streamed request gets."""

    def __init__(self, handler: _Handler, request: JudgeRequest, sequence: int) -> None:
        self._handler = handler
        self._request = request
        self._sequence = sequence
        self._created = int(time.time())
        self._model = request.model or "fake-genrm"
        self._counter = 0

    def open(self) -> None:
        handler = self._handler
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        if self._request.endpoint == "responses":
            opening = self._event(
                "response.created",
                {
                    "response": {
                        "id": f"resp_fake_{self._sequence:08d}",
                        "object": "response",
                        "created_at": self._created,
                        "model": self._model,
                        "status": "in_progress",
                        "output": [],
                    }
                },
            )
        else:
            opening = self._chunk({"role": "assistant", "content": ""}, None)
        self.write(opening)

    def tokens(self, answer: dict[str, Any], produced: int) -> tuple[int, Iterator[bytes]]:
        """The answer's events, one per token, reasoning first, then the answer text:
        (how many, made one by one as they are sent, so a long answer is never held)."""
        if self._request.endpoint == "responses":
            text = answer["output"][1]["content"][0]["text"]
        else:
            text = answer["choices"][0]["message"]["content"]
        pieces = _PIECE.findall(text)
        thinking = max(0, produced - len(pieces))
        return thinking + len(pieces), self._token_events(thinking, pieces)

    def _token_events(self, thinking: int, pieces: list[str]) -> Iterator[bytes]:
        reasoning = words(REASONING_SUMMARY) or ["thinking"]
        responses = self._request.endpoint == "responses"
        for index in range(thinking):
            word = reasoning[index % len(reasoning)] + " "
            if responses:
                yield self._event(
                    "response.reasoning_text.delta",
                    {
                        "item_id": f"rs_fake_{self._sequence:08d}",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": word,
                    },
                )
            else:
                yield self._chunk({"reasoning_content": word}, None)
        for piece in pieces:
            if responses:
                yield self._event(
                    "response.output_text.delta",
                    {
                        "item_id": f"msg_fake_{self._sequence:08d}",
                        "output_index": 1,
                        "content_index": 0,
                        "delta": piece,
                    },
                )
            else:
                yield self._chunk({"content": piece}, None)

    def finish(self, answer: dict[str, Any]) -> None:
        if self._request.endpoint == "responses":
            kind = (
                "response.incomplete" if answer["status"] == "incomplete" else "response.completed"
            )
            tail = self._event(kind, {"response": answer})
        else:
            choice = answer["choices"][0]
            tail = self._chunk({}, choice["finish_reason"])
            if self._request.include_usage:
                tail += self._data({**self._chunk_head(), "choices": [], "usage": answer["usage"]})
            tail += b"data: [DONE]\n\n"
        self.write(tail)
        self._handler.wfile.write(b"0\r\n\r\n")
        self._handler.wfile.flush()

    def write(self, data: bytes) -> None:
        if data:
            wfile = self._handler.wfile
            wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            wfile.flush()

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        body = {"type": kind, **fields, "sequence_number": self._counter}
        self._counter += 1
        return b"event: " + kind.encode() + b"\n" + self._data(body)

    def _chunk_head(self) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-fake-{self._sequence:08d}",
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
        }

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._data({**self._chunk_head(), "choices": [choice]})

    @staticmethod
    def _data(obj: object) -> bytes:
        return b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n"


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
        self._state = JudgeState(self._config)
        self._httpd: _FakeJudgeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("fake judge already started")
        self._state.stopping.clear()
        self._state.node.start()
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
        self._state.node.stop()
        httpd.shutdown()
        httpd.drop_connections()
        httpd.server_close()
        if thread is not None:
            thread.join()
        self._state.node.close()
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

    def control(self, **changes: Any) -> dict[str, Any]:
        """Change the node's mode, served models, slots, speed… (as ``POST /control``)."""
        return self._state.control(changes)

    def node_stats(self) -> dict[str, Any]:
        """The farm-node counters (``GET /stats``'s ``node``)."""
        return self._state.node.snapshot()

    def wait_for_node(self, timeout: float = 30.0, **targets: int) -> dict[str, Any]:
        """Block until every named node counter is >= its target; raise on timeout."""
        met, stats = self._state.node.wait_for(targets, timeout)
        if not met:
            raise TimeoutError(f"node counters {stats} never reached {targets}")
        return stats

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` judge requests were counted (for tests)."""
        state = self._state
        with state.counted:
            return state.counted.wait_for(lambda: state.total >= count, timeout)
