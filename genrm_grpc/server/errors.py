"""Status codes and ``google.rpc.ErrorInfo`` for every refusal (docs/protocol.md, AIP-193)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from genrm_grpc.cohort.model import MAX_METADATA_VALUE_BYTES, Reason, Rejection, clip

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
    Reason.STORE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.JUDGE_FAILED: grpc.StatusCode.UNAVAILABLE,
    Reason.COHORT_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.CALL_WAIT_EXPIRED: grpc.StatusCode.DEADLINE_EXCEEDED,
}


#: Status messages are clipped to this many UTF-8 bytes. With metadata values clipped
#: to MAX_METADATA_VALUE_BYTES, the trailers of the largest error (grpc-message
#: percent-encoded, grpc-status-details-bin in base64) stay under 6 KiB, below the
#: 8 KiB a gRPC client accepts by default, so the ErrorInfo is never lost.
MAX_MESSAGE_BYTES = 1024
MAX_VIOLATION_BYTES = 256
MAX_VIOLATIONS = 4


def status_proto(rejection: Rejection) -> status_pb2.Status:
    """The rich status: code, message, exactly one ErrorInfo (+ BadRequest when invalid)."""
    packed = [_pack(error_info(rejection.reason.value, rejection.metadata))]
    if rejection.field_violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=clip(f, MAX_VIOLATION_BYTES), description=clip(d, MAX_VIOLATION_BYTES)
                )
                for f, d in rejection.field_violations[:MAX_VIOLATIONS]
            ]
        )
        packed.append(_pack(bad))
    return _status(STATUS_OF[rejection.reason], rejection.message, packed)


def error_info(reason: str, metadata: Mapping[str, str] | None) -> error_details_pb2.ErrorInfo:
    """The one ErrorInfo builder: our domain, metadata values clipped (trailers must fit)."""
    meta = {k: clip(v, MAX_METADATA_VALUE_BYTES) for k, v in (metadata or {}).items()}
    return error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=meta)


def _status(code: grpc.StatusCode, message: str, details: list[any_pb2.Any]) -> status_pb2.Status:
    return status_pb2.Status(
        code=getattr(code_pb2, code.name),
        message=clip(message, MAX_MESSAGE_BYTES),
        details=details,
    )


def _pack(message: Message) -> any_pb2.Any:
    holder = any_pb2.Any()
    holder.Pack(message)
    return holder


def error_status(
    code: grpc.StatusCode, reason: str, message: str, metadata: Mapping[str, str] | None = None
) -> grpc.Status:
    """A status with one ErrorInfo for refusals outside the cohort core (e.g. auth)."""
    return rpc_status.to_status(_status(code, message, [_pack(error_info(reason, metadata))]))


def grpc_status(rejection: Rejection) -> grpc.Status:
    return rpc_status.to_status(status_proto(rejection))


async def abort(context: grpc.aio.ServicerContext, rejection: Rejection) -> NoReturn:
    """End the call with the rejection's status (raises, never returns normally). The
    trailing metadata the call set before (the server instance id) goes with it: a status's
    own trailing metadata would replace it."""
    status = grpc_status(rejection)
    kept = tuple(context.trailing_metadata() or ())
    await context.abort(status.code, status.details, kept + tuple(status.trailing_metadata))
    raise AssertionError("abort returned")  # it always raises
