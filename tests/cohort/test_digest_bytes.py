"""The per-member digests write their canonical JSON by hand: pin it to the encoder's."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from genrm_grpc.cohort.identity import CandidateInput, _canonical, candidate_spec, prompt_digest
from genrm_grpc.cohort.model import CandidateSpec, PromptSpec

# Any text protobuf can carry (no lone surrogates), quotes, backslashes and controls.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40) | st.sampled_from(
    ['"', "\\", "\n\t\x00\x7f\u2028", "é ü 漢 😀", "", "null"]
)


@given(
    messages=st.lists(st.tuples(TEXT, TEXT), max_size=4),
    principle=st.none() | TEXT,
    baseline=st.none() | TEXT,
)
def test_prompt_digest_is_sha256_of_the_canonical_json_of_the_prompt(
    messages: list[tuple[str, str]], principle: str | None, baseline: str | None
) -> None:
    prompt = PromptSpec(messages=tuple(messages), principle=principle, baseline_response=baseline)
    body = {
        "messages": [list(m) for m in messages],
        "principle": principle,
        "baseline_response": baseline,
    }
    assert prompt_digest(prompt) == hashlib.sha256(_canonical(body)).hexdigest()


@given(output=TEXT, reasoning=TEXT)
def test_text_candidate_digest_is_sha256_of_the_canonical_json_of_its_texts(
    output: str, reasoning: str
) -> None:
    spec = candidate_spec(CandidateInput(output_text=output, reasoning_text=reasoning))
    assert isinstance(spec, CandidateSpec)
    body = {"output_text": output, "reasoning_text": reasoning}
    assert spec.digest == hashlib.sha256(b"texts:" + _canonical(body)).hexdigest()


def test_absent_and_empty_principle_give_different_prompt_digests() -> None:
    messages = (("user", "q"),)
    absent = PromptSpec(messages=messages, principle=None, baseline_response=None)
    empty = PromptSpec(messages=messages, principle="", baseline_response=None)
    assert prompt_digest(absent) != prompt_digest(empty)


def test_digest_string_encoding_matches_the_json_encoder_for_every_code_point() -> None:
    from genrm_grpc.cohort.identity import _json_string

    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert _json_string(text) == _canonical(text)
