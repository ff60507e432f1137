"""What a request must satisfy before the runtime sees it; the servicer only translates.

Every check that refuses a call on its own, before any cohort rule is asked, is here:

- **message size** (``max_message_bytes``) and the per-field bounds (``bounds.py``);
- **a member's identity**: required fields, defaulting (``num_rollouts_per_prompt``,
  the comparison mode) and the caller's principal stamped into its cohort key;
- **Compare**: draining, the candidates' shape, and the judge passes one principal may
  have in flight (``max_compare_passes_per_principal``);
- **StreamGroups' byte bounds**: what one stream and all streams of one connection may
  hold of members awaiting their outcome (``stream_max_held_bytes``,
  ``connection_max_held_bytes``);
- **how long a call without a deadline may wait** (``max_call_wait_s``);
- **GetCohort's key**: a caller names a group, it means its newest attempt.

The cohort rules (capacity, quotas on active cohorts, attempts, replay) are the
registry's (``genrm_grpc.cohort.registry``). The rule that one request alone is always
admitted is ``genrm_grpc.cohort.quota.admits``, shared with the runtime's Compare bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_grpc.cohort.identity import (
    ComparisonMode,
    candidate_spec,
    coords_metadata,
    prompt_digest,
    resolve,
    resolve_key,
    validate_prompt,
)
from genrm_grpc.cohort.model import (
    ANONYMOUS,
    CandidateSpec,
    CohortKey,
    MemberCoords,
    PromptSpec,
    Reason,
    Rejection,
    Submission,
)
from genrm_grpc.cohort.quota import admits
from genrm_grpc.config import STREAM_MEMBER_OVERHEAD_BYTES
from genrm_grpc.server import convert
from genrm_grpc.server.bounds import FieldBounds
from genrm_grpc.server.security import Principals


class StreamView(Protocol):
    """Bounds of one StreamGroups stream and of all streams of one connection.

    A read-only scoped view; ``Settings`` declares (and validates) the keys once.
    """

    #: Events queued for the client; at the bound the stream stops reading requests.
    @property
    def stream_max_buffered_events(self) -> int: ...
    #: Wire bytes (+ STREAM_MEMBER_OVERHEAD_BYTES each) of members awaiting an outcome.
    @property
    def stream_max_held_bytes(self) -> int: ...
    @property
    def connection_max_held_bytes(self) -> int: ...


class Admission:
    """The admission checks of one server (see the module docstring)."""

    def __init__(
        self,
        *,
        default_group_size: int,
        mode: ComparisonMode,
        max_message_bytes: int,
        max_call_wait_s: float,
        stream_limits: StreamView,
        pass_count: Callable[[int], int],
        bounds: FieldBounds | None = None,
        principals: Principals | None = None,
        max_compare_passes_per_principal: int | None = None,
    ) -> None:
        self._group_size = default_group_size
        self.mode = mode
        self._max_bytes = max_message_bytes
        self.max_wait_s = max_call_wait_s
        self.stream_limits = stream_limits
        self._pass_count = pass_count
        self._bounds = bounds
        self._principals = principals or Principals()
        self._compare_quota = max_compare_passes_per_principal
        #: Judge passes of the Compare calls in flight, per principal (no zero entries).
        self.compare_passes: dict[str, int] = {}
        #: Bytes held by the StreamGroups streams of each connection (no zero entries).
        self.held_by_connection: dict[str, int] = {}

    def principal(self, context: Any) -> str:
        return self._principals.of(context) if self._principals.enabled else ANONYMOUS

    # ------------------------------------------------------------------ members
    def member(self, request: pb.SubmitMemberRequest, principal: str) -> Submission | Rejection:
        """The submission a member request makes, or why it is refused as it stands."""
        size = request.ByteSize()
        if size > self._max_bytes:
            return Rejection(
                Reason.CAPACITY_EXHAUSTED,
                f"member message of {size} bytes exceeds max_message_bytes={self._max_bytes}",
                coords_metadata(convert.coords_from_proto(request.member)),
            )
        if self._bounds is not None:
            out_of_bounds = self._bounds.submission(request)
            if out_of_bounds is not None:
                return out_of_bounds
        if not request.HasField("member"):
            return Rejection(
                Reason.INVALID_MEMBER,
                "invalid member: member is required",
                field_violations=(("member", "required"),),
            )
        sub = resolve(
            convert.coords_from_proto(request.member),
            convert.prompt_from_proto(request.prompt),
            convert.candidate_from_proto(request.candidate),
            default_group_size=self._group_size,
            mode=self.mode,
        )
        if principal and isinstance(sub, Submission):
            sub = dataclasses.replace(sub, key=dataclasses.replace(sub.key, principal=principal))
        return sub

    def stream(self, peer: str) -> StreamBytes:
        """The byte ledger of one new StreamGroups stream on connection ``peer``."""
        return StreamBytes(self, peer)

    # ------------------------------------------------------------------ Compare
    def compare_refusal(self, request: pb.CompareRequest, *, draining: bool) -> Rejection | None:
        if request.ByteSize() > self._max_bytes:
            return Rejection(
                Reason.CAPACITY_EXHAUSTED,
                f"request of {request.ByteSize()} bytes exceeds max_message_bytes",
            )
        if draining:
            return Rejection(Reason.SHUTTING_DOWN, "the server is shutting down")
        if self._bounds is not None:
            return self._bounds.compare(request)
        return None

    @contextlib.contextmanager
    def compare_passes_of(
        self, request: pb.CompareRequest, principal: str
    ) -> Iterator[Rejection | None]:
        """Count the call's judge passes against its principal's in-flight quota.

        Yields the refusal when the principal's passes in flight plus this call's would
        pass ``max_compare_passes_per_principal`` (``admits``: a principal with nothing in
        flight is always admitted, so one large Compare is never refused forever).
        """
        quota = self._compare_quota
        if quota is None:
            yield None
            return
        passes = self._pass_count(len(request.candidates))
        in_flight = self.compare_passes.get(principal, 0)
        if not admits(in_flight, passes, quota):
            yield Rejection(
                Reason.CAPACITY_EXHAUSTED,
                f"principal {principal!r} has {in_flight} Compare judge passes in flight; "
                f"this call needs {passes} more and max_compare_passes_per_principal={quota}",
                {"principal": principal},
            )
            return
        self.compare_passes[principal] = in_flight + passes
        try:
            yield None
        finally:
            left = self.compare_passes[principal] - passes
            if left:
                self.compare_passes[principal] = left
            else:
                del self.compare_passes[principal]

    def compare_inputs(
        self, request: pb.CompareRequest
    ) -> tuple[PromptSpec, list[CandidateSpec]] | Rejection:
        """The prompt and candidates of a Compare call, or the first thing wrong with them."""
        prompt = convert.prompt_from_proto(request.prompt)
        bad = validate_prompt(prompt, self.mode)
        if bad is not None:
            return bad
        if not request.candidates:
            return Rejection(
                Reason.INVALID_MEMBER,
                "invalid request: at least one candidate is required",
                field_violations=(("candidates", "at least one candidate is required"),),
            )
        candidates: list[CandidateSpec] = []
        for n, candidate in enumerate(request.candidates):
            spec = candidate_spec(convert.candidate_from_proto(candidate))
            if isinstance(spec, Rejection):
                return Rejection(
                    spec.reason,
                    spec.message.replace("candidate", f"candidates[{n}]", 1),
                    field_violations=tuple(
                        (f.replace("candidate", f"candidates[{n}]", 1), d)
                        for f, d in spec.field_violations
                    ),
                )
            candidates.append(spec)
        return prompt, candidates

    # ------------------------------------------------------------------ waiting
    def wait_cap(self, context: Any) -> float | None:
        """How long a call may wait: unbounded with a client deadline, else max_call_wait_s."""
        return None if context.time_remaining() is not None else self.max_wait_s

    def wait_expired(self, meta: dict[str, str]) -> Rejection:
        return Rejection(
            Reason.CALL_WAIT_EXPIRED,
            f"the call waited max_call_wait_s={self.max_wait_s:g} without a client deadline; "
            "a submitted member stays in its cohort: resend it (with a deadline) to reattach",
            meta,
        )

    # ------------------------------------------------------------------ GetCohort
    @staticmethod
    def newest_attempt(coords: MemberCoords, latest: int | None) -> MemberCoords:
        """A lookup that names a group but no attempt means the group's newest attempt."""
        if coords.group_id is None or coords.group_attempt is not None or latest is None:
            return coords
        return MemberCoords(rollout_index=0, group_id=coords.group_id, group_attempt=latest)

    @staticmethod
    def cohort_key(coords: MemberCoords, prompt: PromptSpec, principal: str) -> CohortKey:
        """The key a lookup names; a caller sees only its own principal's cohorts."""
        key = resolve_key(coords, prompt_digest(prompt))
        return dataclasses.replace(key, principal=principal) if principal else key


class StreamBytes:
    """What one StreamGroups stream holds of members awaiting their outcome, in bytes.

    It counts against ``stream_max_held_bytes`` for the stream and, with the other
    streams of the same connection, against ``connection_max_held_bytes``.
    """

    __slots__ = ("_admission", "_peer", "held")

    def __init__(self, admission: Admission, peer: str) -> None:
        self._admission = admission
        self._peer = peer
        self.held = 0

    @staticmethod
    def cost(request: pb.StreamGroupsRequest) -> int:
        return request.member.ByteSize() + STREAM_MEMBER_OVERHEAD_BYTES

    def refusal(self, sub: Submission, cost: int) -> Rejection | None:
        """Why holding ``cost`` more bytes is refused now, or None."""
        limits = self._admission.stream_limits
        connection = self._admission.held_by_connection.get(self._peer, 0)
        if self.held + cost > limits.stream_max_held_bytes:
            what, limit = "this stream", f"stream_max_held_bytes={limits.stream_max_held_bytes}"
        elif connection + cost > limits.connection_max_held_bytes:
            what = "this connection's streams"
            limit = f"connection_max_held_bytes={limits.connection_max_held_bytes}"
        else:
            return None
        return Rejection(
            Reason.CAPACITY_EXHAUSTED,
            f"{what} already hold the bytes of members awaiting their outcome up to {limit}; "
            "read the outcomes, then resend this member",
            coords_metadata(sub.coords),
        )

    def hold(self, cost: int) -> None:
        self.held += cost
        connections = self._admission.held_by_connection
        connections[self._peer] = connections.get(self._peer, 0) + cost

    def release(self, cost: int) -> None:
        self.held -= cost
        connections = self._admission.held_by_connection
        left = connections.get(self._peer, 0) - cost
        if left > 0:
            connections[self._peer] = left
        else:
            connections.pop(self._peer, None)
