"""Decoding the rich status of the service, and the one exception type of the client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = [
    "CONNECT_FAILED",
    "NEVER_RETRY",
    "REGENERATE_GROUP",
    "RETRY_SAME_CALL",
    "CohortConnectError",
    "CohortError",
    "ErrorDetails",
    "error_info",
    "status_error_info",
]

CONNECT_FAILED = "CONNECT_FAILED"
"""The reason of :class:`CohortConnectError` (set by the client, not sent by a server)."""

RETRY_SAME_CALL = frozenset({grpc.StatusCode.UNAVAILABLE})
REGENERATE_GROUP = frozenset({grpc.StatusCode.ABORTED})
NEVER_RETRY = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)


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


def _code_of(number: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)


def status_error_info(status: status_pb2.Status) -> ErrorDetails:
    """Decode a ``google.rpc.Status`` (as carried by ``MemberError`` on streams)."""
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
        code=_code_of(status.code),
        message=status.message,
        reason=reason,
        domain=domain,
        metadata=metadata,
        field_violations=tuple(violations),
    )


def error_info(error: grpc.RpcError) -> ErrorDetails:
    """Decode the rich status of a failed call (works for sync and aio errors)."""
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # inconsistent trailers: fall back to the plain status
        status = None
    if status is None:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        return ErrorDetails(code=code or grpc.StatusCode.UNKNOWN, message=message or "")
    return status_error_info(status)


class CohortError(Exception):
    """Every failure the client surfaces: status code, ErrorInfo reason, metadata, message.

    ``attempts`` counts the calls made for this submission (1 when it was not retried);
    ``group_attempt`` is the group attempt the error belongs to, when known.
    """

    def __init__(
        self,
        details: ErrorDetails,
        *,
        attempts: int = 1,
        group_id: str | None = None,
        group_attempt: int | None = None,
    ) -> None:
        self.details = details
        self.attempts = attempts
        self.group_id = group_id
        self.group_attempt = group_attempt
        where = f" (group {group_id} attempt {group_attempt})" if group_id is not None else ""
        reason = f" {details.reason}" if details.reason else ""
        super().__init__(f"{details.code.name}{reason}: {details.message}{where}")

    @property
    def code(self) -> grpc.StatusCode:
        return self.details.code

    @property
    def reason(self) -> str:
        return self.details.reason

    @property
    def metadata(self) -> dict[str, str]:
        return self.details.metadata

    @property
    def message(self) -> str:
        return self.details.message

    @property
    def field_violations(self) -> tuple[tuple[str, str], ...]:
        return self.details.field_violations

    @property
    def retry_same_call(self) -> bool:
        return self.details.retry_same_call

    @property
    def regenerate_group(self) -> bool:
        return self.details.regenerate_group

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, **kwargs: Any) -> CohortError:
        return cls(error_info(error), **kwargs)


class CohortConnectError(CohortError):
    """The client could not connect to ``target`` within its connect deadline.

    Raised (code ``UNAVAILABLE``, reason ``CONNECT_FAILED``, metadata ``target``) instead
    of waiting silently until a call's deadline when nothing answers at the address. For
    ``ChannelOptions.connect_failure_cache_s`` after a failed attempt, further calls get
    the same failure at once (``failed_s_ago`` set) instead of waiting again. It is not
    retried: check the address, start the server, or give
    ``ChannelOptions.connect_timeout_s=None`` (or a longer one) to wait for a server that
    is still starting.
    """

    def __init__(
        self,
        target: str,
        timeout_s: float,
        cause: str,
        *,
        failed_s_ago: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.cause = cause
        #: Set when this is the remembered failure of an earlier attempt (no new wait).
        self.failed_s_ago = failed_s_ago
        message = f"cannot connect to {target} within {timeout_s:g} s: {cause}"
        if failed_s_ago is not None:
            message += f" (that attempt failed {failed_s_ago:.1f} s ago; not tried again yet)"
        details = ErrorDetails(
            code=grpc.StatusCode.UNAVAILABLE,
            message=message,
            reason=CONNECT_FAILED,
            metadata={"target": target},
        )
        super().__init__(details, **kwargs)
