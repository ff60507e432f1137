"""Admission, the one module of checks a request passes before the runtime sees it.

The servicer's end-to-end tests pin what a client sees; these pin the rules themselves,
without a server: what is refused, why, and that the byte ledgers give back what they took.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_grpc.cohort.model import MemberCoords, Reason, Rejection, Submission
from genrm_grpc.cohort.quota import admits
from genrm_grpc.server.admission import Admission

from .conftest import PROMPT, candidate, member

# No server and no store: one run is enough.
pytestmark = pytest.mark.stores("memory")


@dataclass(frozen=True)
class Limits:
    stream_max_buffered_events: int = 64
    stream_max_held_bytes: int = 10_000
    connection_max_held_bytes: int = 15_000


def _admission(**overrides: object) -> Admission:
    kwargs: dict[str, object] = {
        "default_group_size": 4,
        "mode": "rollout_cohort",
        "max_message_bytes": 4096,
        "max_call_wait_s": 30.0,
        "stream_limits": Limits(),
        "pass_count": lambda n: n,
    }
    kwargs.update(overrides)
    return Admission(**kwargs)  # type: ignore[arg-type]


def _request(index: int = 0, text: str | None = None) -> pb.SubmitMemberRequest:
    cand = candidate(index) if text is None else pb.Candidate(output_text=text)
    return pb.SubmitMemberRequest(member=member(index), prompt=PROMPT, candidate=cand)


def test_one_request_alone_is_always_admitted_whatever_its_cost() -> None:
    assert admits(0, 1_000, 10)
    assert admits(4, 6, 10)
    assert not admits(4, 7, 10)


def test_a_member_over_max_message_bytes_is_capacity_exhausted_before_it_is_decoded() -> None:
    refused = _admission(max_message_bytes=64).member(_request(text="x" * 200), "")
    assert isinstance(refused, Rejection)
    assert refused.reason is Reason.CAPACITY_EXHAUSTED
    assert "max_message_bytes=64" in refused.message


def test_a_request_without_member_is_invalid() -> None:
    refused = _admission().member(pb.SubmitMemberRequest(prompt=PROMPT), "")
    assert isinstance(refused, Rejection)
    assert refused.reason is Reason.INVALID_MEMBER
    assert refused.field_violations == (("member", "required"),)


def test_the_callers_principal_is_stamped_into_the_cohort_key() -> None:
    sub = _admission().member(_request(), "team-a")
    assert isinstance(sub, Submission)
    assert sub.key.principal == "team-a"
    assert sub.group_size == member(0).group_size


def test_compare_passes_are_counted_per_principal_and_given_back() -> None:
    admission = _admission(max_compare_passes_per_principal=5)
    three = pb.CompareRequest(prompt=PROMPT, candidates=[candidate(k) for k in range(3)])
    with admission.compare_passes_of(three, "a") as first:
        assert first is None
        with admission.compare_passes_of(three, "a") as second:
            assert isinstance(second, Rejection)
            assert second.reason is Reason.CAPACITY_EXHAUSTED
        with admission.compare_passes_of(three, "b") as other:
            assert other is None  # another principal's quota is its own
        assert admission.compare_passes == {"a": 3}
    assert admission.compare_passes == {}


def test_compare_is_refused_while_draining() -> None:
    request = pb.CompareRequest(prompt=PROMPT, candidates=[candidate(0)])
    refused = _admission().compare_refusal(request, draining=True)
    assert isinstance(refused, Rejection)
    assert refused.reason is Reason.SHUTTING_DOWN


def test_compare_names_the_first_bad_candidate_by_index() -> None:
    request = pb.CompareRequest(
        prompt=PROMPT, candidates=[candidate(0), pb.Candidate(responses_api_json="[1]")]
    )
    refused = _admission().compare_inputs(request)
    assert isinstance(refused, Rejection)
    assert refused.reason is Reason.INVALID_MEMBER
    assert any(field.startswith("candidates[1]") for field, _ in refused.field_violations)


def test_stream_bytes_count_against_the_stream_and_the_connection_then_are_released() -> None:
    admission = _admission()
    sub = admission.member(_request(), "")
    assert isinstance(sub, Submission)
    first, second = admission.stream("peer-1"), admission.stream("peer-1")
    first.hold(9_000)
    over_stream = first.refusal(sub, 1_001)
    assert over_stream is not None and "stream_max_held_bytes" in over_stream.message
    over_connection = second.refusal(sub, 6_001)
    assert over_connection is not None and "connection_max_held_bytes" in over_connection.message
    assert admission.stream("peer-2").refusal(sub, 6_001) is None
    first.release(9_000)
    assert admission.held_by_connection == {}
    assert second.refusal(sub, 6_001) is None


def test_a_lookup_naming_only_the_group_means_its_newest_attempt() -> None:
    named = MemberCoords(rollout_index=0, group_id="g", group_attempt=None)
    assert Admission.newest_attempt(named, 3).group_attempt == 3
    assert Admission.newest_attempt(named, None).group_attempt is None
    pinned = MemberCoords(rollout_index=0, group_id="g", group_attempt=1)
    assert Admission.newest_attempt(pinned, 3).group_attempt == 1
