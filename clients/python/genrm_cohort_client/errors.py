"""Decoding the rich status of the service, and the one exception type of the client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = [
    "CLIENT_DOMAIN",
    "CONNECT_FAILED",
    "NEVER_RETRY",
    "REGENERATE_GROUP",
    "RETRY_SAME_CALL",
    "SERVER_OVERLOADED",
    "CohortConnectError",
    "CohortError",
    "ErrorDetails",
    "error_info",
    "status_error_info",
]

#: ErrorInfo reason of a server that refuses a call because it holds too many (its
#: pending/concurrent RPC limits): retried with backoff, whatever the status code.
SERVER_OVERLOADED = "SERVER_OVERLOADED"
#: Reason of :class:`CohortConnectError` (minted by this client, domain CLIENT_DOMAIN).
CONNECT_FAILED = "CONNECT_FAILED"
CLIENT_DOMAIN = "client.cohort.genrm.v1"

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
    of waiting silently until a call's deadline when nothing answers at the address. It
    is not retried, and it is remembered for ``ChannelOptions.connect_failure_ttl_s``:
    calls in that time raise it at once (``age_s`` then says how long ago the attempt
    failed; None for the attempt itself). Check the address, start the server, or give
    ``ChannelOptions.connect_timeout_s=None`` (or a longer one) to wait for a server
    that is still starting.
    """

    def __init__(
        self,
        target: str,
        timeout_s: float,
        cause: str,
        *,
        age_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.cause = cause
        self.age_s = age_s
        message = f"cannot connect to {target} within {timeout_s:g} s: {cause}"
        if age_s is not None:
            message += f" (remembered: the attempt failed {age_s:.1f} s ago)"
        details = ErrorDetails(
            code=grpc.StatusCode.UNAVAILABLE,
            message=message,
            reason=CONNECT_FAILED,
            domain=CLIENT_DOMAIN,
            metadata={"target": target},
        )
        super().__init__(details, **kwargs)

    def again(self, age_s: float | None) -> CohortConnectError:
        """The same failure, raised anew for another call (``age_s`` after it)."""
        return CohortConnectError(self.target, self.timeout_s, self.cause, age_s=age_s)
