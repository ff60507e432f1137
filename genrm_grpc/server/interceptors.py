"""Interceptors that every server installs, whatever its configuration.

:class:`UndecodableRequestInterceptor` turns request bytes that are not a valid protobuf
message into ``INVALID_ARGUMENT`` / ``INVALID_MEMBER`` with ErrorInfo (docs/protocol.md:
"malformed message"). Left to grpcio, a deserializer's ``DecodeError`` surfaces as
``UNKNOWN``, which clients cannot tell from a server bug.

On a StreamGroups stream an undecodable message is one bad member, not a bad stream:
it is handed to the handler (see :func:`is_undecodable`), which answers it with a
``MemberError`` and goes on reading.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from genrm_grpc.cohort.model import Reason, Rejection
from genrm_grpc.server.errors import grpc_status


class _Undecodable:
    """Stands in for a request whose bytes did not decode."""

    __slots__ = ("error",)

    def __init__(self, error: DecodeError) -> None:
        self.error = error


#: Request streams whose handler answers an undecodable message itself (per member).
MEMBERWISE_STREAMS = frozenset({"/genrm.cohort.v1.CohortService/StreamGroups"})


def is_undecodable(request: object) -> bool:
    """True for the stand-in of a streamed request whose bytes did not decode."""
    return isinstance(request, _Undecodable)


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except DecodeError as exc:
            return _Undecodable(exc)

    return deserialize


def _rejection(method: str, bad: _Undecodable) -> Rejection:
    description = f"the request bytes are not a valid message: {bad.error}"
    return Rejection(
        Reason.INVALID_MEMBER,
        f"invalid request to {method}: {description}",
        field_violations=(("request", description),),
    )


class UndecodableRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps each method's handler once; every call of the method reuses the wrapper.

    Building the wrapper (a lenient deserializer, the guard, a new method handler) per
    call cost a few µs of every RPC; the registered handlers do not change while the
    server runs, so the wrapper is cached per method, next to the handler it wraps (a
    different handler for the same method, e.g. behind another interceptor, is wrapped
    anew). The cache holds one entry per method the server has (unknown methods have no
    handler and are not cached).
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _wrap(method: str, handler: Any) -> Any:
    kwargs = {
        "request_deserializer": _lenient(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _guard(method, handler.unary_unary, check_stream=False), **kwargs
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _guard(method, handler.unary_stream, check_stream=False), **kwargs
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _guard(method, handler.stream_unary, check_stream=True), **kwargs
        )
    return grpc.stream_stream_rpc_method_handler(
        _guard(method, handler.stream_stream, check_stream=method not in MEMBERWISE_STREAMS),
        **kwargs,
    )


class _UndecodableInStream(Exception):
    """Ends a request stream whose next message did not decode."""

    def __init__(self, bad: _Undecodable) -> None:
        super().__init__(str(bad.error))
        self.bad = bad


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Undecodable):
            raise _UndecodableInStream(request)
        yield request


def _guard(method: str, behavior: Any, *, check_stream: bool) -> Any:
    """The handler as a coroutine (streamed responses go out through context.write)."""

    async def guarded(request: Any, context: Any) -> Any:
        if isinstance(request, _Undecodable):
            await context.abort_with_status(grpc_status(_rejection(method, request)))
        try:
            result = behavior(_checked(request) if check_stream else request, context)
            if hasattr(result, "__aiter__"):
                async for response in result:
                    await context.write(response)
                return None
            return await result
        except _UndecodableInStream as exc:
            await context.abort_with_status(grpc_status(_rejection(method, exc.bad)))

    return guarded
