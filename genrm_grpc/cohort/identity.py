"""Identity rules: validation of coordinates, cohort keys, prompt and response digests."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Literal

import orjson

from genrm_grpc.cohort.model import (
    MAX_METADATA_VALUE_BYTES,
    CandidateSpec,
    CohortKey,
    MemberCoords,
    PromptSpec,
    Reason,
    Rejection,
    Submission,
    clip,
)
from genrm_grpc.scoring.extract import extract_texts
from genrm_grpc.scoring.types import AnswerTexts

ComparisonMode = Literal["rollout_cohort", "fixed_baseline"]

MAX_GROUP_SIZE = 4096
MAX_ID_LENGTH = 512
#: Deepest nesting of arrays/objects accepted in ``responses_api_json``. A Responses-API
#: object nests about six levels; thousands of levels would exhaust the recursion of the
#: JSON codec (an unhandled RecursionError), so depth is checked first, without recursion.
MAX_JSON_DEPTH = 64

# A JSON string literal (escapes included); bytes that are not brackets; bracket values.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_DELTA = [0] * 256
for _open, _close in (b"[]", b"{}"):
    _BRACKET_DELTA[_open], _BRACKET_DELTA[_close] = 1, -1


@dataclass(frozen=True, slots=True)
class CandidateInput:
    """A candidate as it arrives: texts, or a Responses-API object as JSON."""

    output_text: str = ""
    reasoning_text: str = ""
    responses_api_json: str = ""


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _json_string(text: str) -> bytes:
    """``text`` as a JSON string literal in UTF-8, byte for byte what ``_canonical`` writes.

    orjson's string encoding equals that of ``json.dumps(..., ensure_ascii=False)`` for
    every code point but the lone surrogates, which it refuses
    (``tests/cohort/test_digest_bytes.py`` checks every code point); those go through
    ``json``, whose UTF-8 encoding fails on them as before (they cannot come off the
    wire: protobuf strings are valid UTF-8).
    """
    try:
        return orjson.dumps(text)
    except orjson.JSONEncodeError:
        encoded: str = json.encoder.encode_basestring(text)
        return encoded.encode()


def _string_or_null(value: str | None) -> bytes:
    return b"null" if value is None else _json_string(value)


def prompt_digest(prompt: PromptSpec) -> str:
    """SHA-256 over the conversation, the principle and the baseline (absent ≠ empty).

    The digested bytes are ``_canonical`` of ``{"messages": [[role, content], ...],
    "principle": ..., "baseline_response": ...}``, written out directly (keys in sorted
    order, the same string encoding): this runs for every member, and the generic
    encoder cost several µs more (``tests/cohort/test_digest_bytes.py`` pins the equality).
    """
    messages = b",".join(
        b"[" + _json_string(role) + b"," + _json_string(content) + b"]"
        for role, content in prompt.messages
    )
    canonical = (
        b'{"baseline_response":'
        + _string_or_null(prompt.baseline_response)
        + b',"messages":['
        + messages
        + b'],"principle":'
        + _string_or_null(prompt.principle)
        + b"}"
    )
    return hashlib.sha256(canonical).hexdigest()


def json_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, computed without recursion.

    String literals are removed first (brackets inside them do not nest); the running
    sum of +1/-1 over the remaining brackets is done by C iterators, not a Python loop.
    Malformed text gets some number; ``json.loads`` refuses it afterwards anyway.
    """
    outside = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    brackets = outside.translate(None, _NOT_BRACKET)
    return max(itertools.accumulate(map(_BRACKET_DELTA.__getitem__, brackets)), default=0)


def _reject_nonfinite(token: str) -> float:
    raise ValueError(f"non-finite number {token} in responses_api_json")


def _finite_float(token: str) -> float:
    # 1e999 is valid JSON but overflows to infinity; it would not survive the canonical
    # re-encoding (json.dumps writes "Infinity"), so it is refused like NaN/Infinity.
    value = float(token)
    if not math.isfinite(value):
        _reject_nonfinite(token)
    return value


def candidate_spec(candidate: CandidateInput) -> CandidateSpec | Rejection:
    """Texts and digest of a candidate; equal payload ⇔ equal digest."""
    if candidate.responses_api_json:
        if candidate.output_text or candidate.reasoning_text:
            return _invalid(
                "candidate",
                "set either responses_api_json or output_text/reasoning_text, not both",
            )
        depth = json_depth(candidate.responses_api_json)
        if depth > MAX_JSON_DEPTH:
            return _invalid(
                "candidate.responses_api_json",
                f"nested {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted",
            )
        try:
            obj = json.loads(
                candidate.responses_api_json,
                parse_constant=_reject_nonfinite,
                parse_float=_finite_float,
            )
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            return _invalid("candidate.responses_api_json", f"not valid JSON: {exc}")
        if not isinstance(obj, dict):
            return _invalid("candidate.responses_api_json", "must be a JSON object")
        try:
            canonical = _canonical(obj)
        except UnicodeEncodeError:
            # Valid JSON may escape a lone surrogate ("\\ud800"): not encodable text.
            return _invalid("candidate.responses_api_json", "contains an unpaired surrogate")
        digest = hashlib.sha256(b"responses_api:" + canonical).hexdigest()
        return CandidateSpec(texts=extract_texts(obj), digest=digest)
    # _canonical({"output_text": ..., "reasoning_text": ...}), written out directly.
    canonical = (
        b'texts:{"output_text":'
        + _json_string(candidate.output_text)
        + b',"reasoning_text":'
        + _json_string(candidate.reasoning_text)
        + b"}"
    )
    digest = hashlib.sha256(canonical).hexdigest()
    texts = AnswerTexts(reasoning=candidate.reasoning_text, answer=candidate.output_text)
    return CandidateSpec(texts=texts, digest=digest)


def _invalid(field_name: str, description: str) -> Rejection:
    return Rejection(
        Reason.INVALID_MEMBER,
        f"invalid member: {field_name}: {description}",
        field_violations=((field_name, description),),
    )


def validate_prompt(prompt: PromptSpec, mode: ComparisonMode) -> Rejection | None:
    if not prompt.messages:
        return _invalid("prompt.messages", "the conversation must have at least one message")
    for n, (role, _content) in enumerate(prompt.messages):
        if not role:
            return _invalid(f"prompt.messages[{n}].role", "must not be empty")
    if mode == "fixed_baseline" and prompt.baseline_response is None:
        return _invalid("prompt.baseline_response", "required in fixed_baseline mode")
    if mode == "rollout_cohort" and prompt.baseline_response is not None:
        return _invalid("prompt.baseline_response", "forbidden in rollout_cohort mode")
    return None


def resolve_key(coords: MemberCoords, digest_of_prompt: str) -> CohortKey:
    attempt = coords.group_attempt or 0
    if coords.group_id is not None:
        return CohortKey(group_id=coords.group_id, legacy_key=None, attempt=attempt)
    if coords.task_index is not None:
        head = f"t{coords.task_index}"
    elif coords.prompt_id is not None:
        head = f"p{coords.prompt_id}"
    else:
        head = "-"
    return CohortKey(group_id=None, legacy_key=f"{head}:{digest_of_prompt[:32]}", attempt=attempt)


def resolve(
    coords: MemberCoords,
    prompt: PromptSpec,
    candidate: CandidateInput,
    *,
    default_group_size: int,
    mode: ComparisonMode,
) -> Submission | Rejection:
    """Validate one member and compute its cohort key and digests (INVALID_MEMBER on error).

    A refusal names the member in its metadata (``groupId``, ``groupAttempt``,
    ``rolloutIndex``) as far as the request gave them, so a collector can tell which of
    its members was malformed.
    """
    checked = _check(coords, prompt, candidate, default_group_size=default_group_size, mode=mode)
    if isinstance(checked, Rejection):
        return replace(checked, metadata={**coords_metadata(coords), **checked.metadata})
    return checked


def coords_metadata(coords: MemberCoords | None, **extra: str) -> dict[str, str]:
    """ErrorInfo metadata naming a member (only the coordinates it sent) plus ``extra``.

    The one builder of ErrorInfo metadata for the cohort protocol: every value is clipped
    to ``MAX_METADATA_VALUE_BYTES`` so that an over-long id is never echoed whole.
    """
    meta: dict[str, str] = {}
    if coords is not None:
        meta["rolloutIndex"] = str(coords.rollout_index)
        if coords.group_id is not None:
            meta["groupId"] = coords.group_id
            meta["groupAttempt"] = str(coords.group_attempt or 0)
    meta.update(extra)
    return {k: clip(v, MAX_METADATA_VALUE_BYTES) for k, v in meta.items()}


def check_ids(coords: MemberCoords) -> Rejection | None:
    """The bounds on ids, shared by every RPC that takes a ``MemberRef``."""
    if coords.group_id is not None and not coords.group_id.strip():
        return _invalid("member.group_id", "must not be blank when set")
    if coords.group_id is not None and len(coords.group_id) > MAX_ID_LENGTH:
        return _invalid("member.group_id", f"longer than {MAX_ID_LENGTH} characters")
    if coords.prompt_id is not None and len(coords.prompt_id) > MAX_ID_LENGTH:
        return _invalid("member.prompt_id", f"longer than {MAX_ID_LENGTH} characters")
    return None


def _check(
    coords: MemberCoords,
    prompt: PromptSpec,
    candidate: CandidateInput,
    *,
    default_group_size: int,
    mode: ComparisonMode,
) -> Submission | Rejection:
    bad_ids = check_ids(coords)
    if bad_ids is not None:
        return bad_ids
    group_size = coords.group_size if coords.group_size is not None else default_group_size
    if not 1 <= group_size <= MAX_GROUP_SIZE:
        return _invalid("member.group_size", f"must be in [1, {MAX_GROUP_SIZE}], got {group_size}")
    if not 0 <= coords.rollout_index < group_size:
        return _invalid(
            "member.rollout_index",
            f"must be in [0, {group_size}) for group_size {group_size}, got {coords.rollout_index}",
        )
    bad_prompt = validate_prompt(prompt, mode)
    if bad_prompt is not None:
        return bad_prompt
    spec = candidate_spec(candidate)
    if isinstance(spec, Rejection):
        return spec
    digest = prompt_digest(prompt)
    return Submission(
        coords=coords,
        key=resolve_key(coords, digest),
        group_size=group_size,
        prompt=prompt,
        prompt_digest=digest,
        candidate=spec,
    )
