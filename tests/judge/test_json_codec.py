"""The judge client's JSON goes through orjson but decodes and encodes what json does."""

from __future__ import annotations

import json

import pytest

from genrm_grpc.judge.wire import decode_json, encode, read_answer, read_usage

# Bodies orjson refuses and json.loads reads: they must decode exactly as before.
JSON_ONLY_BODIES = [
    b'{"status": "completed", "usage": {"input_tokens": NaN}}',
    b'{"output": [], "note": "\\ud800"}',
    b'{"score": Infinity, "other": -Infinity}',
]


@pytest.mark.parametrize("raw", JSON_ONLY_BODIES)
def test_bodies_orjson_refuses_decode_as_json_decodes_them(raw: bytes) -> None:
    decoded = decode_json(raw)
    # NaN != NaN: compare the re-encoded text, which json writes the same for both.
    assert json.dumps(decoded) == json.dumps(json.loads(raw))


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": 1,}', b"\xff\xfe{}", b"{} {}"])
def test_bodies_json_refuses_are_refused_as_value_errors(raw: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(ValueError):
        decode_json(raw)


def test_nesting_too_deep_for_json_fails_as_it_did_with_json() -> None:
    raw = b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(RecursionError):
        json.loads(raw)
    with pytest.raises(RecursionError):
        decode_json(raw)


@pytest.mark.parametrize("tokens", [2**64 - 1, 2**64, 123456789012345678901234567890])
def test_token_counts_beyond_64_bits_read_the_same_from_either_decoder(tokens: int) -> None:
    raw = (
        b'{"status": "completed", "output": [{"type": "message", "content": '
        b'[{"type": "output_text", "text": "ok"}]}], '
        b'"usage": {"input_tokens": %d, "output_tokens": 7}}' % tokens
    )
    fast, slow = decode_json(raw), json.loads(raw)
    assert read_usage(fast, "responses") == read_usage(slow, "responses")
    assert read_answer(fast, "responses") == read_answer(slow, "responses")
    usage = read_usage(fast, "responses")
    assert usage is not None
    assert usage.input_tokens == (tokens if tokens < 2**64 else 0)


def test_request_bodies_encode_the_same_json_as_json_dumps() -> None:
    payload = {
        "model": "genrm",
        "input": [{"role": "user", "content": 'é ü 漢 😀 " \\ \n \x00 \u2028'}],
        "metadata": {"response_1": "a" * 3000, "response_2": "", "principle": "p"},
        "max_output_tokens": 512,
        "temperature": 0.6,
        "top_p": 1.0,
    }
    assert json.loads(encode(payload)) == payload


def test_a_lone_surrogate_is_encoded_as_json_dumps_encodes_it() -> None:
    payload = {"metadata": {"response_1": "x\ud800y"}}
    assert encode(payload) == json.dumps(payload).encode("utf-8")
