"""Collector-side client of genrm-grpc.

The generated stubs live in ``genrm.cohort.v1`` (``cohort_pb2``, ``cohort_pb2_grpc``);
this module adds a small asyncio :class:`CohortClient` and :func:`error_info`, which
decodes the ``google.rpc.ErrorInfo`` every non-OK status of the service carries.

What to do with a status (see docs/protocol.md):
``UNAVAILABLE`` → retry the same call; ``ABORTED`` → the group failed, regenerate the
whole group under a new ``group_attempt``; anything else → do not retry.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = ["CohortClient", "ErrorDetails", "error_info", "status_error_info"]

RETRY_SAME_CALL = frozenset({grpc.StatusCode.UNAVAILABLE})
REGENERATE_GROUP = frozenset({grpc.StatusCode.ABORTED})


@dataclass(frozen=True)
class ErrorDetails:
    """The typed part of an error: status code, ErrorInfo reason/metadata, field violations."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    domain: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    field_violations: tuple[tuple[str, str], ...] = ()

    @property
    def retry_same_call(self) -> bool:
        return self.code in RETRY_SAME_CALL

    @property
    def regenerate_group(self) -> bool:
        return self.code in REGENERATE_GROUP


def status_error_info(status: status_pb2.Status) -> ErrorDetails:
    """Decode a ``google.rpc.Status`` (as carried by ``MemberError`` on streams)."""
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), grpc.StatusCode.UNKNOWN)
    details = ErrorDetails(code=code, message=status.message)
    reason, domain, metadata = "", "", {}
    violations: list[tuple[str, str]] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.extend((v.field, v.description) for v in bad.field_violations)
    return ErrorDetails(
        code=details.code,
        message=details.message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=tuple(violations),
    )


def error_info(error: grpc.RpcError) -> ErrorDetails:
    """Decode the rich status of a failed call (works for sync and aio errors)."""
    status = rpc_status.from_call(error)
    if status is None:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        return ErrorDetails(code=code, message=message or "")
    return status_error_info(status)


class CohortClient:
    """A thin asyncio wrapper over the generated stub, one channel per client."""

    def __init__(self, target: str, *, channel: grpc.aio.Channel | None = None) -> None:
        self._channel = channel or grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.CohortServiceStub(self._channel)

    async def __aenter__(self) -> CohortClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def submit_member(
        self,
        member: pb.MemberRef,
        prompt: pb.Prompt,
        candidate: pb.Candidate,
        *,
        timeout: float | None = None,
    ) -> pb.MemberResult:
        request = pb.SubmitMemberRequest(member=member, prompt=prompt, candidate=candidate)
        response: pb.SubmitMemberResponse = await self.stub.SubmitMember(request, timeout=timeout)
        return response.result

    async def stream_groups(
        self,
        requests: AsyncIterable[pb.SubmitMemberRequest] | Iterable[pb.SubmitMemberRequest],
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[pb.StreamGroupsResponse]:
        """Send members on one stream; yields accepted / pair_judged / result / error events."""

        async def wrap() -> AsyncIterator[pb.StreamGroupsRequest]:
            if isinstance(requests, AsyncIterable):
                async for item in requests:
                    yield pb.StreamGroupsRequest(member=item)
            else:
                for item in requests:
                    yield pb.StreamGroupsRequest(member=item)

        call = self.stub.StreamGroups(wrap(), timeout=timeout)
        async for event in call:
            yield event

    async def compare(
        self, prompt: pb.Prompt, candidates: Iterable[pb.Candidate], *, timeout: float | None = None
    ) -> pb.CompareResponse:
        request = pb.CompareRequest(prompt=prompt, candidates=list(candidates))
        response: pb.CompareResponse = await self.stub.Compare(request, timeout=timeout)
        return response

    async def get_cohort(
        self, member: pb.MemberRef, prompt: pb.Prompt | None = None, *, timeout: float | None = None
    ) -> pb.CohortInfo:
        request = pb.GetCohortRequest(member=member, prompt=prompt)
        response: pb.GetCohortResponse = await self.stub.GetCohort(request, timeout=timeout)
        return response.cohort
