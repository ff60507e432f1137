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

With ``"stream": true`` either route answers as server-sent events (``SSEStream`` in
``testing/stream.py``), its tokens emitted over the node's simulated decode time. The
request and answer bodies are read and written in ``testing/bodies.py``.

Also: ``GET /v1/models`` (the served model names), ``GET /health``, ``GET /stats``,
``POST /stats/reset`` and ``POST /faults``.


Verdicts come from ``genrm_grpc.testing.heuristic``; ``FakeJudgeServer``
(``testing/inprocess.py``) runs the server in a daemon thread of the calling process,
``genrm-grpc fake-judge`` (``genrm_grpc.testing.cli``) in a process of its own.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import math
import socket
import struct
import sys
import threading
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any

from genrm_grpc.testing.bodies import (
    BadRequest,
    answer_body,
    error_body,
    models_body,
    parse_judge_request,
)
from genrm_grpc.testing.faults import (
    JudgeRequest,
    JudgeState,
)
from genrm_grpc.testing.node import Plan, Ticket, prompt_tokens
from genrm_grpc.testing.stream import SSEStream

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------


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
            self._send_json(200, models_body(self._state.models))
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
            self._send_json(404, error_body(f"no route GET {path}", "not_found", 404))

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
            self._send_json(404, error_body(f"no route POST {path}", "not_found", 404))

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
            self._send_json(400, error_body(str(exc), "invalid_request_error", 400))
            return
        self._send_json(200, faults)

    def _control(self, raw: bytes) -> None:
        try:
            changes = json.loads(raw or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            state = self._state.control({str(k).replace("-", "_"): v for k, v in changes.items()})
        except (ValueError, TypeError) as exc:
            self._send_json(400, error_body(str(exc), "invalid_request_error", 400))
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
            self._send_json(400, error_body(str(exc), "invalid_request_error", 400))
            return
        self._send_json(200 if met else 408, stats)

    # -- judging --------------------------------------------------------------------

    def _judge(self, endpoint: str, raw: bytes) -> None:
        state = self._state
        node = state.node
        authorization = self.headers.get("Authorization")
        try:
            request = parse_judge_request(endpoint, json.loads(raw))
        except (ValueError, BadRequest) as exc:
            state.record(endpoint, "bad_request", authorization)
            self._send_json(400, error_body(str(exc), "invalid_request_error", 400))
            return
        mode = node.mode
        if mode == "503":
            state.record(endpoint, "mode_503", authorization)
            node.count("requests")
            node.count("rejected_503")
            self._send_json(503, error_body("node in 503 mode", "ServiceUnavailable", 503))
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
                    SSEStream(self, request, sequence).open()
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
            self._send_json(404, error_body(message, "NotFoundError", 404))
        elif outcome == "fail_400":
            self._send_json(400, error_body("injected bad request", "BadRequestError", 400))
        elif outcome == "fail_503":
            self._send_json(503, error_body("injected overload", "ServiceUnavailable", 503))
        elif outcome == "fail_429":
            retry_after = state.config.retry_after_s
            headers = {} if retry_after is None else {"Retry-After": str(math.ceil(retry_after))}
            self._send_json(429, error_body("injected rate limit", "RateLimitError", 429), headers)
        else:
            self._generate(request, outcome, sequence, ticket)

    def _generate(self, request: JudgeRequest, outcome: str, sequence: int, ticket: Ticket) -> None:
        """Everything that takes a generation: it waits for a slot, then spends its
        simulated prefill and decode time there."""
        state = self._state
        node = state.node
        if not node.acquire(ticket):
            self._drop()
            return
        plan = node.plan(ticket, prompt_tokens(request.messages), request.max_tokens)
        if plan.truncated and outcome == "ok":
            outcome = "budget_exhaust"
        answer = answer_body(request, outcome, sequence, state.config, plan)
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
        stream = SSEStream(self, request, sequence)
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
