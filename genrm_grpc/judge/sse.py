"""A streamed judge answer (server-sent events) reassembled into the non-streamed body.

Sans-IO: ``SSEAnswer.feed`` takes the bytes as they arrive and returns how many
generated tokens they carried; ``body()`` is then the very object the non-streamed
request's JSON body decodes to, as far as the client reads it, so that
``wire.read_answer``/``read_usage`` and the verdict parser see the same thing
whether ``judge.stream`` is on or off:

* ``chat_completions`` (``"stream": true, "stream_options": {"include_usage": true}``):
  ``data:`` lines of ``chat.completion.chunk`` objects, then ``data: [DONE]``. The
  ``delta.content`` pieces of choice 0 are joined into ``choices[0].message.content``
  (``None`` if none came, as a non-streamed answer without content), its last
  non-null ``finish_reason`` is kept (``length`` = the budget ran out), and the chunk
  carrying ``usage`` gives the usage. No chunk with a choice gives no ``choices``, which
  the client reads as a malformed answer, as it would a non-streamed one.
* ``responses`` (``"stream": true``): typed events; ``response.completed``,
  ``response.incomplete`` and ``response.failed`` carry the whole response object
  (``status``, ``incomplete_details``, ``output``, ``usage``), which is the body.

A token is an event whose delta carries generated text (answer, reasoning or a
reasoning summary): vLLM sends one per decode step, so the count follows the judge's
output tokens while it runs; the usage of the last event has the exact figure.
``max_response_bytes`` caps the answer text (and any single line), not the stream's
bytes: the events' framing is many times the text they carry.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import orjson

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class StreamError(ValueError):
    """The stream is not a judge answer (an event that is not JSON, an error event)."""


class StreamTooLarge(Exception):
    """The answer text (or one line) grew past the cap."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes or more")
        self.size = size


class SSEAnswer:
    """Incremental reader of one streamed answer; see the module docstring."""

    def __init__(self, api: Literal["responses", "chat_completions"], cap: int) -> None:
        self._chat = api == "chat_completions"
        self._cap = cap
        self._pending = bytearray()
        self._data: list[bytes] = []
        self._text: list[str] = []
        self._content_seen = False
        self._choice_seen = False
        self._finish_reason: object = None
        self._usage: object = None
        self._final: object = None
        #: Bytes of answer text so far.
        self.text_bytes = 0
        #: The last event arrived (``[DONE]``, or a terminal response event).
        self.done = False
        #: Generated-text events so far.
        self.tokens = 0

    def feed(self, chunk: bytes) -> int:
        """Take the next bytes; return the tokens they completed."""
        before = self.tokens
        pending = self._pending
        scan = len(pending)  # what is pending holds no newline: look in the new bytes only
        pending += chunk
        start = 0
        while True:
            end = pending.find(b"\n", scan)
            if end < 0:
                break
            scan = end + 1
            line = bytes(pending[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                if line.startswith(b"data:"):
                    value = line[5:]
                    self._data.append(value[1:] if value.startswith(b" ") else value)
                # ``event:``, ``id:``, ``retry:`` and ``:`` comments: the JSON has the type.
                continue
            if self._data:
                data = b"\n".join(self._data)
                self._data.clear()
                self._event(data)
        del pending[:start]
        if len(pending) > self._cap:
            raise StreamTooLarge(len(pending))
        return self.tokens - before

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished line held (a large one is decoded when it ends)."""
        return len(self._pending)

    def _event(self, data: bytes) -> None:
        if self.done:
            return
        if self._chat and data == b"[DONE]":
            self.done = True
            return
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            try:  # what orjson refuses and json reads (NaN, lone surrogates), as bodies
                event = json.loads(data)
            except ValueError:
                raise StreamError("an event is not JSON") from None
        if not isinstance(event, dict):
            raise StreamError("an event is not a JSON object")
        if self._chat:
            self._chunk(event)
        else:
            self._response_event(event)

    def _chunk(self, event: dict[str, Any]) -> None:
        if "error" in event:
            raise StreamError("the judge reported an error mid-stream")
        usage = event.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        self._choice_seen = True
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        content = delta.get("content")
        generated = False
        if isinstance(content, str):
            self._content_seen = True
            if content:
                self._add_text(content)
                generated = True
        for key in ("reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                generated = True
        self.tokens += generated

    def _response_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if not isinstance(kind, str):
            return
        if kind == "error":
            raise StreamError("the judge reported an error mid-stream")
        if kind in _TERMINAL:
            self._final = event.get("response")
            self.done = True
            return
        if kind.endswith(".delta"):
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                if kind == "response.output_text.delta":
                    self._add_text(delta)
                self.tokens += 1

    def _add_text(self, text: str) -> None:
        self._text.append(text)
        self.text_bytes += len(text.encode("utf-8", "surrogatepass"))
        if self.text_bytes > self._cap:
            raise StreamTooLarge(self.text_bytes)

    def body(self) -> Any:
        """The answer as the non-streamed body (call once ``done``)."""
        if not self._chat:
            if not isinstance(self._final, dict):
                raise StreamError("the last event carries no response object")
            return self._final
        body: dict[str, Any] = {}
        if self._choice_seen:
            content = "".join(self._text) if self._content_seen else None
            message = {"role": "assistant", "content": content}
            body["choices"] = [
                {"index": 0, "message": message, "finish_reason": self._finish_reason}
            ]
        if self._usage is not None:
            body["usage"] = self._usage
        return body


__all__ = ["SSEAnswer", "StreamError", "StreamTooLarge"]
