"""The fake judge's streamed answers: server-sent events in chunked transfer encoding.

``SSEStream`` writes one answer through the request handler of
``genrm_grpc.testing.server`` as vLLM streams both APIs, its tokens paced by the node's
simulated decode time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from genrm_grpc.testing.faults import (
    JudgeRequest,
)
from genrm_grpc.testing.heuristic import REASONING_SUMMARY, words

if TYPE_CHECKING:
    from genrm_grpc.testing.server import _Handler

_PIECE = re.compile(r"\s*\S+|\s+$")
"""An answer's text as stream tokens: each non-blank run with the blanks before it."""


class SSEStream:
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
