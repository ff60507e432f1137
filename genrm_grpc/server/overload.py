"""The server's own bound on concurrent cohort calls, answered with a typed refusal.

Every waiting ``SubmitMember`` call is a call in progress for as long as its group
collects and is judged, so the number of calls in progress is the number of members
outstanding (a ``StreamGroups`` stream counts once, whatever it carries). Past
``max_concurrent_rpcs`` a new ``CohortService`` call is refused before it reaches the
servicer with ``UNAVAILABLE`` and ErrorInfo reason ``SERVER_OVERLOADED`` (metadata
``maxConcurrentRpcs``), which ``genrm-cohort-client`` resends after a backoff: the
member never reached a cohort, so nothing about it has to be undone.

grpc.aio's own ``maximum_concurrent_rpcs`` answers ``RESOURCE_EXHAUSTED`` without
ErrorInfo, which a collector cannot tell from a quota it must not retry blindly; this
interceptor is the typed version. Health and reflection are not counted and never
refused: a probe must see an overloaded server as serving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from genrm_grpc.server.errors import error_status

SERVER_OVERLOADED = "SERVER_OVERLOADED"

#: Only calls of these services are counted and refused.
COUNTED_PREFIX = "/genrm.cohort.v1.CohortService/"


class ConcurrentCallLimit(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts CohortService calls in progress and refuses those past ``limit``.

    The count is taken when the call's handler starts and released when it ends, however
    it ends (answered, refused by the servicer, cancelled by the caller, aborted by a
    drain). The wrapper is built once per method, as in
    :class:`~genrm_grpc.server.interceptors.UndecodableRequestInterceptor`; the inner
    handlers it wraps are coroutines that write streamed responses themselves.
    """

    def __init__(self, limit: int, *, on_refused: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.in_progress = 0
        self.on_refused = on_refused
        self._refusal = error_status(
            grpc.StatusCode.UNAVAILABLE,
            SERVER_OVERLOADED,
            f"the server has {limit} calls in progress (max_concurrent_rpcs): "
            "resend this call after a backoff",
            {"maxConcurrentRpcs": str(limit)},
        )
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(COUNTED_PREFIX):
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Any) -> Any:
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._counted(handler.unary_unary), **kwargs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._counted(handler.unary_stream), **kwargs
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._counted(handler.stream_unary), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(self._counted(handler.stream_stream), **kwargs)

    def _counted(self, behavior: Any) -> Any:
        async def counted(request: Any, context: Any) -> Any:
            if self.in_progress >= self.limit:
                if self.on_refused is not None:
                    self.on_refused()
                await context.abort_with_status(self._refusal)
            self.in_progress += 1
            try:
                result = behavior(request, context)
                if hasattr(result, "__aiter__"):  # an async-generator handler
                    async for response in result:
                        await context.write(response)
                    return None
                return await result
            finally:
                self.in_progress -= 1

        return counted


__all__ = ["COUNTED_PREFIX", "SERVER_OVERLOADED", "ConcurrentCallLimit"]
