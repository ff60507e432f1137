"""Status codes and ``google.rpc.ErrorInfo`` for every refusal (PROTOCOL.md, AIP-193)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from genrm_grpc.cohort.model import Reason, Rejection

DOMAIN = "cohort.genrm.v1"

STATUS_OF: Mapping[Reason, grpc.StatusCode] = {
    Reason.INVALID_MEMBER: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.SLOT_CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Reason.COHORT_CLOSED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.PROMPT_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.ATTEMPT_SUPERSEDED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.COHORT_FAILED: grpc.StatusCode.ABORTED,
    Reason.CAPACITY_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    Reason.JUDGE_FAILED: grpc.StatusCode.UNAVAILABLE,
    Reason.COHORT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
}


def status_proto(rejection: Rejection) -> status_pb2.Status:
    """The rich status: code, message, exactly one ErrorInfo (+ BadRequest when invalid)."""
    code = STATUS_OF[rejection.reason]
    info = error_details_pb2.ErrorInfo(
        reason=rejection.reason.value, domain=DOMAIN, metadata=dict(rejection.metadata)
    )
    packed = [_pack(info)]
    if rejection.field_violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in rejection.field_violations
            ]
        )
        packed.append(_pack(bad))
    return status_pb2.Status(
        code=getattr(code_pb2, code.name), message=rejection.message, details=packed
    )


def _pack(message: Message) -> any_pb2.Any:
    holder = any_pb2.Any()
    holder.Pack(message)
    return holder


def error_status(
    code: grpc.StatusCode, reason: str, message: str, metadata: Mapping[str, str] | None = None
) -> grpc.Status:
    """A status with one ErrorInfo for refusals outside the cohort core (e.g. auth)."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=dict(metadata or {}))
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=message, details=[_pack(info)]
    )
    return rpc_status.to_status(status)


def grpc_status(rejection: Rejection) -> grpc.Status:
    return rpc_status.to_status(status_proto(rejection))


async def abort(context: grpc.aio.ServicerContext, rejection: Rejection) -> NoReturn:
    """End the call with the rejection's status (raises, never returns normally)."""
    await context.abort_with_status(grpc_status(rejection))
    raise AssertionError("abort_with_status returned")  # it always raises
