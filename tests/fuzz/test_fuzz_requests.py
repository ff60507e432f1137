"""Hostile and malformed requests against a live server (hypothesis).

Every answer must be typed (docs/protocol.md's codes with exactly one ErrorInfo), a result,
or, for a valid member whose group never fills, our own client deadline; never UNKNOWN
(an unhandled exception). While the fuzzing runs, a bystander cohort waits and other
groups complete; afterwards both are checked against ``aggregate`` of their verdicts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genrm_grpc.cohort.identity import CandidateInput, candidate_spec
from genrm_grpc.cohort.model import Rejection
from tests.store_kinds import store_env_of_kind

from .live import PROMPT, LiveServer, assert_typed, call_error, check_rewards, stream_error

UINT32_MAX = 2**32 - 1
INT64 = st.integers(-(2**63), 2**63 - 1)
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


@pytest.fixture(scope="module")
def live(store_kind: str, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """One server per module and kind of store (tests/store_kinds.py)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in store_env_of_kind(store_kind, request, fresh_file=True).items():
            patch.setenv(name, value)
        server = LiveServer()
        server.start()
        try:
            yield server
        finally:
            server.stop()


def around_bystander(live: LiveServer, name: str, body: object) -> None:
    bystander = live.run(live.start_bystander(f"bystander/{name}"))
    body()  # type: ignore[operator]
    live.run(live.finish_bystander(bystander), timeout=60)


# ------------------------------------------------------------------ strategies
texts = st.one_of(
    st.just(""),
    st.text(max_size=40),
    st.integers(60_000, 100_000).map(lambda n: "x" * n),  # over max_message_bytes=64 KiB
    st.integers(1, 3000).map(lambda n: "y" * n),
)
finite = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | finite | st.integers() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
responses_objects = st.builds(
    lambda r, a: json.dumps(
        {
            "output": [
                {"type": "reasoning", "summary": [{"text": r}]},
                {"type": "message", "content": [{"type": "output_text", "text": a}]},
            ]
        }
    ),
    st.text(max_size=20),
    st.text(max_size=20),
)
responses_json = st.one_of(
    st.just(""),
    responses_objects,
    st.text(max_size=30),  # mostly invalid JSON
    json_values.map(json.dumps),  # valid JSON, often not an object
    st.sampled_from(['{"a": NaN}', '{"a": Infinity}', "[-Infinity]", '{"a": 1e999}', "NaN"]),
    st.integers(1, 5000).map(lambda d: "[" * d + "]" * d),  # deep nesting
    # Around the nesting bound and just below the codec's recursion limit (~980 levels
    # used to pass json.loads and crash the canonical encoding: UNKNOWN).
    st.integers(60, 70).map(lambda d: '{"output": ' + "[" * d + "]" * d + "}"),
    st.integers(900, 1000).map(lambda d: '{"a": ' * d + "1" + "}" * d),
    st.just('{"output": "\\ud800"}'),  # a lone surrogate, valid JSON
)
candidates = st.builds(
    lambda o, r, j: pb.Candidate(output_text=o, reasoning_text=r, responses_api_json=j),
    texts,
    st.one_of(st.just(""), st.text(max_size=20)),
    responses_json,
)
roles = st.sampled_from(["user", "assistant", "system", "", "tool", "x" * 100])
prompts = st.builds(
    lambda msgs, principle, baseline: pb.Prompt(
        messages=[pb.ChatMessage(role=r, content=c) for r, c in msgs],
        **({"principle": principle} if principle is not None else {}),
        **({"baseline_response": baseline} if baseline is not None else {}),
    ),
    st.lists(st.tuples(roles, texts), max_size=3),
    st.none() | st.text(max_size=20),
    st.none() | st.just("a baseline"),
)
indices = st.one_of(st.integers(0, 8), st.just(UINT32_MAX), st.integers(0, UINT32_MAX))
group_ids = st.one_of(
    st.none(),
    st.just(""),
    st.just("   "),
    st.just("fz:" + "g" * 600),
    st.just("fz:" + "😀" * 511),  # valid (512 characters), 2 KiB echoed whole
    st.integers(513, 20_000).map(lambda n: "fz:" + "é" * n),  # over-long, non-ASCII
    st.text(max_size=12).map(lambda t: "fz:" + t),
)
prompt_ids = st.one_of(
    st.text(max_size=12), st.just("p" * 512), st.integers(513, 20_000).map(lambda n: "p" * n)
)


@st.composite
def member_refs(draw: st.DrawFn) -> pb.MemberRef:
    ref = pb.MemberRef(rollout_index=draw(indices))
    gid = draw(group_ids)
    if gid is not None:
        ref.group_id = gid
    for name, strategy in (
        ("group_attempt", indices),
        (
            "group_size",
            st.one_of(st.integers(0, 9), st.just(4096), st.just(4097), st.just(UINT32_MAX)),
        ),
        ("task_index", INT64),
        ("prompt_id", prompt_ids),
    ):
        value = draw(st.none() | strategy)
        if value is not None:
            setattr(ref, name, value)
    return ref


submit_requests = st.builds(
    lambda m, p, c, has_member: pb.SubmitMemberRequest(
        member=m if has_member else None, prompt=p, candidate=c
    ),
    member_refs(),
    prompts,
    candidates,
    st.booleans().map(lambda b: b or True) | st.just(False),
)


# ------------------------------------------------------------------ checks
async def submit_both_ways(live: LiveServer, request: pb.SubmitMemberRequest) -> None:
    """Unary (short deadline: a valid member may wait) and on a stream (first event)."""
    assert live.stub is not None
    unary_code = None
    try:
        response = await live.stub.SubmitMember(request, timeout=0.5)
        assert math.isfinite(response.result.reward)
    except grpc.RpcError as exc:
        unary_code = exc.code()
        if unary_code != grpc.StatusCode.DEADLINE_EXCEEDED:
            assert_typed(call_error(exc))
    call = live.stub.StreamGroups(iter([pb.StreamGroupsRequest(member=request)]), timeout=10)
    first = await call.read()
    call.cancel()
    kind = first.WhichOneof("event")
    if kind == "error":
        err = stream_error(first.error.status)
        assert_typed(err)
        if err.code == grpc.StatusCode.INVALID_ARGUMENT:
            assert unary_code == grpc.StatusCode.INVALID_ARGUMENT  # validation is stateless
    else:
        assert kind == "accepted", first
        assert unary_code != grpc.StatusCode.INVALID_ARGUMENT


def test_hostile_members_get_typed_answers_and_bystanders_complete(live: LiveServer) -> None:
    @FUZZ
    @given(request=submit_requests)
    def check(request: pb.SubmitMemberRequest) -> None:
        live.run(submit_both_ways(live, request))

    around_bystander(live, "members", check)


@st.composite
def unknown_fields(draw: st.DrawFn) -> bytes:
    """Encoded fields with numbers the schema does not use (all wire types)."""
    out = b""
    for _ in range(draw(st.integers(1, 4))):
        number = draw(st.integers(100, 2**29 - 1))
        wire = draw(st.sampled_from([0, 1, 2, 5]))
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(draw(st.integers(0, 2**64 - 1)))
        elif wire == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            payload = draw(st.binary(max_size=64))
            out += _varint(len(payload)) + payload
    return out


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_unknown_fields_are_ignored_and_the_member_is_judged(live: LiveServer) -> None:
    counter = iter(range(10**9))

    @FUZZ
    @given(
        top=unknown_fields(),
        nested=unknown_fields(),
        where=st.sampled_from(["top", "member", "both"]),
    )
    def check(top: bytes, nested: bytes, where: str) -> None:
        # A group of one gets default_score without a judge call: a known answer.
        ref = pb.MemberRef(
            group_id=f"fz:unknown/{next(counter)}", group_attempt=0, rollout_index=0, group_size=1
        )
        body = pb.SubmitMemberRequest(prompt=PROMPT, candidate=pb.Candidate(output_text="hi"))
        ref_bytes = ref.SerializeToString() + (nested if where != "top" else b"")
        raw = b"\x0a" + _varint(len(ref_bytes)) + ref_bytes + body.SerializeToString()
        raw += top if where != "member" else b""
        response = pb.SubmitMemberResponse.FromString(
            live.run(live.send_raw("SubmitMember", raw, 10))
        )
        assert response.result.member.group_id == ref.group_id
        assert response.result.reward == 3.0 and not response.result.mask_sample

    around_bystander(live, "unknown", check)


async def send_bytes(live: LiveServer, method: str, raw: bytes, message: type) -> None:
    try:
        message.FromString(raw)
    except DecodeError:
        decodable = False
    else:
        decodable = True
    try:
        await live.send_raw(method, raw, 0.5)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and decodable:
            return  # a valid member waiting for its group
        if not decodable:
            # Not a message at all: a malformed message is INVALID_ARGUMENT (docs/protocol.md);
            # gRPC's own INTERNAL for undecodable bytes is tolerated. Never UNKNOWN.
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), (
                f"{method}: undecodable bytes answered {code}: {exc.details()}"
            )
            return
        assert_typed(call_error(exc))
    else:
        assert decodable, f"{method} accepted bytes that do not decode"


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("SubmitMember", pb.SubmitMemberRequest),
        ("Compare", pb.CompareRequest),
        ("GetCohort", pb.GetCohortRequest),
    ],
)
def test_random_bytes_get_typed_errors_never_unknown(
    live: LiveServer, method: str, message: type
) -> None:
    @FUZZ
    @given(raw=st.binary(max_size=200) | submit_requests.map(lambda r: r.SerializeToString()[:-1]))
    def check(raw: bytes) -> None:
        live.run(send_bytes(live, method, raw, message))

    around_bystander(live, f"bytes-{method}", check)


async def compare(live: LiveServer, request: pb.CompareRequest) -> None:
    assert live.stub is not None
    try:
        response = await live.stub.Compare(request, timeout=20)
    except grpc.RpcError as exc:
        assert_typed(call_error(exc))
        return
    texts = []
    for c in request.candidates:
        spec = candidate_spec(CandidateInput(c.output_text, c.reasoning_text, c.responses_api_json))
        assert not isinstance(spec, Rejection)
        texts.append(spec.texts)
    assert len(response.rewards) == len(texts)
    check_rewards(texts, list(response.rewards), list(response.comparisons), live.scoring)


def test_hostile_compare_requests_are_typed_or_scored_correctly(live: LiveServer) -> None:
    @FUZZ
    @given(prompt=prompts, cands=st.lists(candidates, max_size=5))
    def check(prompt: pb.Prompt, cands: list[pb.Candidate]) -> None:
        live.run(compare(live, pb.CompareRequest(prompt=prompt, candidates=cands)))

    around_bystander(live, "compare", check)


async def get_cohort(live: LiveServer, request: pb.GetCohortRequest) -> None:
    assert live.stub is not None
    try:
        response = await live.stub.GetCohort(request, timeout=10)
    except grpc.RpcError as exc:
        err = call_error(exc)
        assert_typed(err)
        assert all(len(v.encode()) <= 512 for v in err.metadata.values()), err.metadata
        assert len(err.message.encode()) <= 1024
        return
    assert response.cohort.key


def test_hostile_get_cohort_requests_are_typed_and_fit_the_trailers(live: LiveServer) -> None:
    @FUZZ
    @given(ref=member_refs(), prompt=prompts)
    def check(ref: pb.MemberRef, prompt: pb.Prompt) -> None:
        live.run(get_cohort(live, pb.GetCohortRequest(member=ref, prompt=prompt)))

    around_bystander(live, "get-cohort", check)
