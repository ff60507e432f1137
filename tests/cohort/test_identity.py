"""Identity rules: cohort keys, prompt digests and response digests."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from genrm_grpc.cohort.identity import (
    CandidateInput,
    candidate_spec,
    prompt_digest,
    resolve,
    resolve_key,
)
from genrm_grpc.cohort.model import (
    CandidateSpec,
    CohortKey,
    MemberCoords,
    PromptSpec,
    Reason,
    Rejection,
)

from .support import PROMPT, sub

RESPONSES = {
    "id": "resp_1",
    "status": "completed",
    "output": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think "}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Jupiter."}]},
    ],
}


def spec(candidate: CandidateInput) -> CandidateSpec:
    got = candidate_spec(candidate)
    assert isinstance(got, CandidateSpec), got
    return got


def responses_digest(obj: Any, **dump: Any) -> str:
    return spec(CandidateInput(responses_api_json=json.dumps(obj, **dump))).digest


# ---------------------------------------------------------------- response digest


def test_equal_texts_give_equal_digests_and_any_change_differs() -> None:
    a = spec(CandidateInput(output_text="Jupiter.", reasoning_text="think"))
    b = spec(CandidateInput(output_text="Jupiter.", reasoning_text="think"))
    assert a.digest == b.digest
    assert a.texts.answer == "Jupiter." and a.texts.reasoning == "think"
    variants = [
        CandidateInput(output_text="Jupiter", reasoning_text="think"),
        CandidateInput(output_text="Jupiter.", reasoning_text=""),
        CandidateInput(output_text="Jupiter. ", reasoning_text="think"),
        # Moving text from one field to the other is a different payload.
        CandidateInput(output_text="", reasoning_text="Jupiter.think"),
        CandidateInput(output_text="Jupiter.think", reasoning_text=""),
    ]
    digests = {spec(v).digest for v in variants}
    assert len(digests) == len(variants) and a.digest not in digests


def test_responses_digest_ignores_key_order_and_whitespace() -> None:
    base = responses_digest(RESPONSES)
    reordered = json.loads(json.dumps(RESPONSES), object_pairs_hook=lambda p: dict(reversed(p)))
    assert list(reordered) != list(RESPONSES)
    assert responses_digest(reordered) == base
    assert responses_digest(RESPONSES, indent=4) == base
    assert responses_digest(RESPONSES, separators=(" , ", " : ")) == base
    assert responses_digest(RESPONSES, ensure_ascii=True) == base


def test_responses_digest_changes_with_any_field_not_only_the_extracted_text() -> None:
    base = responses_digest(RESPONSES)
    assert responses_digest({**RESPONSES, "id": "resp_2"}) != base
    assert responses_digest({**RESPONSES, "status": "incomplete"}) != base
    # Same extracted texts, different payload: different digest.
    a = spec(CandidateInput(responses_api_json=json.dumps(RESPONSES)))
    b = spec(CandidateInput(responses_api_json=json.dumps({**RESPONSES, "id": "x"})))
    assert a.texts == b.texts and a.digest != b.digest


def test_texts_and_responses_forms_of_the_same_answer_differ() -> None:
    from_json = spec(CandidateInput(responses_api_json=json.dumps(RESPONSES)))
    from_texts = spec(
        CandidateInput(output_text=from_json.texts.answer, reasoning_text=from_json.texts.reasoning)
    )
    assert from_json.texts == from_texts.texts
    assert from_json.digest != from_texts.digest
    # Nor can a texts payload collide with a Responses object holding the same keys.
    texts_like = {"output_text": "Jupiter.", "reasoning_text": "think"}
    assert (
        responses_digest(texts_like)
        != spec(CandidateInput(output_text="Jupiter.", reasoning_text="think")).digest
    )


def test_texts_are_extracted_from_the_responses_object() -> None:
    got = spec(CandidateInput(responses_api_json=json.dumps(RESPONSES)))
    assert got.texts.answer == "Jupiter."
    assert got.texts.reasoning == "think "


def test_an_empty_answer_is_judged_as_the_literal_none() -> None:
    assert spec(CandidateInput()).texts.judge_text() == "None"
    assert spec(CandidateInput(output_text="  \n")).texts.judge_text() == "None"


# ---------------------------------------------------------------- prompt digest


def test_the_prompt_digest_covers_messages_principle_and_baseline() -> None:
    base = prompt_digest(PROMPT)
    assert prompt_digest(PromptSpec(PROMPT.messages)) == base
    changed = [
        PromptSpec(PROMPT.messages[:-1]),
        PromptSpec((*PROMPT.messages[:-1], ("user", "Name the largest moon."))),
        PromptSpec((("assistant", PROMPT.messages[0][1]), *PROMPT.messages[1:])),
        PromptSpec(tuple(reversed(PROMPT.messages))),
        PromptSpec(PROMPT.messages, principle="be kind"),
        PromptSpec(PROMPT.messages, principle=""),  # absent ≠ empty
        PromptSpec(PROMPT.messages, baseline_response="Saturn."),
        PromptSpec(PROMPT.messages, baseline_response=""),
        PromptSpec(PROMPT.messages, principle="x", baseline_response="y"),
        PromptSpec(PROMPT.messages, principle="y", baseline_response="x"),
    ]
    digests = [prompt_digest(p) for p in changed]
    assert base not in digests
    assert len(set(digests)) == len(digests)


def test_message_boundaries_are_part_of_the_prompt_digest() -> None:
    a = PromptSpec((("user", "ab"), ("user", "c")))
    b = PromptSpec((("user", "a"), ("user", "bc")))
    c = PromptSpec((("user", "abc"),))
    assert len({prompt_digest(a), prompt_digest(b), prompt_digest(c)}) == 3


# ---------------------------------------------------------------- cohort keys


def test_an_explicit_group_key_is_group_id_and_attempt() -> None:
    digest = prompt_digest(PROMPT)
    key = resolve_key(MemberCoords(0, group_id="g", group_attempt=2, task_index=1), digest)
    assert key == CohortKey(group_id="g", legacy_key=None, attempt=2)
    assert key.explicit and str(key) == "g:g#2"
    # The prompt is not part of an explicit key.
    other = resolve_key(MemberCoords(1, group_id="g", group_attempt=2), "0" * 64)
    assert other == key
    assert resolve_key(MemberCoords(0, group_id="g"), digest).attempt == 0


def test_legacy_keys_prefer_task_index_to_prompt_id() -> None:
    digest = prompt_digest(PROMPT)
    both = resolve_key(MemberCoords(0, task_index=7, prompt_id="p"), digest)
    task = resolve_key(MemberCoords(0, task_index=7), digest)
    prompt = resolve_key(MemberCoords(0, prompt_id="p"), digest)
    neither = resolve_key(MemberCoords(0), digest)
    assert both == task and not both.explicit
    assert len({task, prompt, neither}) == 3
    assert both.group_id is None and both.legacy_key is not None
    # The legacy key also covers the prompt digest and the attempt.
    assert resolve_key(MemberCoords(0, task_index=7), "f" * 64) != task
    assert resolve_key(MemberCoords(0, task_index=7, group_attempt=1), digest) != task


def test_task_index_and_prompt_id_never_collide() -> None:
    digest = prompt_digest(PROMPT)
    assert resolve_key(MemberCoords(0, task_index=1), digest) != resolve_key(
        MemberCoords(0, prompt_id="1"), digest
    )


def test_members_of_a_legacy_group_share_a_key_and_sizes_default() -> None:
    a = sub(0, gid=None, task_index=3, size=None, default_group_size=4)
    b = sub(3, gid=None, task_index=3, size=None, default_group_size=4)
    assert a.key == b.key and a.group_size == b.group_size == 4
    assert a.prompt_digest == b.prompt_digest


# ---------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.integers(-(10**12), 10**12) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=5)


def _shuffled(obj: Any, rng: random.Random) -> Any:
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [_shuffled(v, rng) for v in obj]
    return obj


@settings(max_examples=150, deadline=None)
@given(obj=json_objects, seed=st.integers(0, 2**32), indent=st.none() | st.integers(0, 3))
def test_responses_digest_is_canonical(obj: dict[str, Any], seed: int, indent: int | None) -> None:
    shuffled = _shuffled(obj, random.Random(seed))
    assert responses_digest(shuffled, indent=indent, ensure_ascii=seed % 2 == 0) == (
        responses_digest(obj)
    )


@settings(max_examples=150, deadline=None)
@given(a=json_objects, b=json_objects)
def test_equal_payload_iff_equal_responses_digest(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert (responses_digest(a) == responses_digest(b)) == (a == b)


@settings(max_examples=150, deadline=None)
@given(
    a=st.tuples(st.text(max_size=6), st.text(max_size=6)),
    b=st.tuples(st.text(max_size=6), st.text(max_size=6)),
)
def test_equal_texts_iff_equal_digest(a: tuple[str, str], b: tuple[str, str]) -> None:
    da = spec(CandidateInput(output_text=a[0], reasoning_text=a[1])).digest
    db = spec(CandidateInput(output_text=b[0], reasoning_text=b[1])).digest
    assert (da == db) == (a == b)


def test_a_responses_object_with_an_unpaired_surrogate_is_invalid_not_a_crash() -> None:
    for payload in ('{"output": "\\ud800"}', '{"\\udfff": 1}'):
        got = candidate_spec(CandidateInput(responses_api_json=payload))
        assert isinstance(got, Rejection), got
        assert got.reason is Reason.INVALID_MEMBER
        assert got.field_violations[0][0] == "candidate.responses_api_json"
    # A properly paired surrogate escape is ordinary text.
    ok = spec(CandidateInput(responses_api_json='{"output": "\\ud83d\\ude00"}'))
    assert ok.digest == responses_digest({"output": "\U0001f600"})


def test_absurdly_deep_responses_json_is_invalid_not_a_crash() -> None:
    depth = 100_000
    payload = '{"output": ' + "[" * depth + "]" * depth + "}"
    got = candidate_spec(CandidateInput(responses_api_json=payload))
    assert isinstance(got, Rejection) and got.reason is Reason.INVALID_MEMBER


def test_an_invalid_member_is_named_in_the_refusal_metadata() -> None:
    coords = MemberCoords(rollout_index=9, group_id="g7", group_attempt=2, group_size=4)
    refused = resolve(
        coords, PROMPT, CandidateInput(output_text="x"), default_group_size=8, mode="rollout_cohort"
    )
    assert isinstance(refused, Rejection)
    assert refused.metadata == {"groupId": "g7", "groupAttempt": "2", "rolloutIndex": "9"}
    legacy = resolve(
        MemberCoords(rollout_index=0, task_index=3),
        PROMPT,
        CandidateInput(output_text="x", responses_api_json="{}"),
        default_group_size=8,
        mode="rollout_cohort",
    )
    assert isinstance(legacy, Rejection)
    assert legacy.metadata == {"rolloutIndex": "0"}


def test_a_number_that_overflows_to_infinity_is_invalid_like_nan() -> None:
    for text in ('{"output": [], "x": 1e999}', '{"output": [], "x": -1E400}', '{"x": NaN}'):
        refused = candidate_spec(CandidateInput(responses_api_json=text))
        assert isinstance(refused, Rejection), text
        assert refused.reason is Reason.INVALID_MEMBER
    ok = candidate_spec(CandidateInput(responses_api_json='{"output": [], "x": 1e300}'))
    assert isinstance(ok, CandidateSpec)


def test_a_keys_cached_hash_and_scope_follow_its_identity_only() -> None:
    """CohortKey works its hash and group scope out once: equal keys hash alike, a key
    made again (``replace``, ``pickle``: another process hashes strings differently)
    works them out again, and neither is part of equality, order or repr."""
    import dataclasses
    import pickle

    key = CohortKey("g", None, 2, "alice")
    again = CohortKey("g", None, 2, "alice")
    assert key == again and hash(key) == hash(again) and len({key, again}) == 1
    assert hash(key) == hash(("g", None, 2, "alice"))
    assert key.group_scope == again.group_scope == "5:aliceg"
    moved = dataclasses.replace(key, attempt=3)
    assert moved.attempt == 3 and hash(moved) == hash(("g", None, 3, "alice"))
    assert pickle.loads(pickle.dumps(key)) == key
    assert CohortKey(None, "k", 1).group_scope is None
    assert CohortKey("a", None, 1) < CohortKey("b", None, 0)
    assert repr(key) == "CohortKey(group_id='g', legacy_key=None, attempt=2, principal='alice')"
