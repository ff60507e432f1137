"""Transport security and caller authentication: TLS/mTLS credentials, bearer tokens.

Bearer tokens are checked by an aio server interceptor before any handler runs. Every
method needs a valid ``authorization: Bearer <token>`` header except the health service,
which stays open so load balancers and kubelet probes need no secret. Reflection is not
exempt: it discloses the API, and grpcurl sends ``-H`` headers with reflection requests
too. Tokens are compared in constant time against every configured token and are never
logged or echoed in an error.

Authenticated callers are *principals* (:class:`Principals`): a token's principal is named
in the tokens file, a client certificate's principal is its first subject alternative
name (else its common name). Every cohort key includes the principal.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc

from genrm_grpc.cohort.model import ANONYMOUS
from genrm_grpc.config import TlsSettings
from genrm_grpc.server.errors import error_status

log = logging.getLogger(__name__)

#: Methods callable without a token: health probes (Check and Watch).
OPEN_PREFIXES: tuple[str, ...] = ("/grpc.health.v1.Health/",)
UNAUTHENTICATED_REASON = "UNAUTHENTICATED"
_SCHEME = "bearer "


def server_credentials(tls: TlsSettings) -> Any:
    """``grpc.ssl_server_credentials`` for the configured files (mTLS with a client CA)."""
    key = tls.key_file.read_bytes()
    cert = tls.cert_file.read_bytes()
    client_ca = tls.client_ca_file.read_bytes() if tls.client_ca_file is not None else None
    return grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=client_ca,
        require_client_auth=tls.require_client_auth,
    )


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without a valid bearer token with UNAUTHENTICATED + ErrorInfo."""

    def __init__(
        self,
        tokens: Iterable[str],
        *,
        open_prefixes: tuple[str, ...] = OPEN_PREFIXES,
        on_denied: Callable[[str], None] | None = None,
    ) -> None:
        self._tokens = tuple(t.encode("ascii") for t in tokens)
        if not self._tokens:
            raise ValueError("at least one token is required")
        self._open = open_prefixes
        self._on_denied = on_denied

    def authorized(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
        """None when a valid token is present, else why not ("missing" or "invalid")."""
        header = None
        for key, value in metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
                break
        if header is None or header[: len(_SCHEME)].lower() != _SCHEME:
            return "missing"
        presented = header[len(_SCHEME) :].strip().encode("utf-8", "surrogateescape")
        # Compare against every token without stopping early: timing reveals neither
        # which token matched nor how much of one did.
        match = False
        for token in self._tokens:
            match |= hmac.compare_digest(presented, token)
        return None if match else "invalid"

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(self._open):
            return handler
        why = self.authorized(handler_call_details.invocation_metadata)
        if why is None:
            return handler
        log.warning("unauthenticated call refused", extra={"method": method, "auth": why})
        if self._on_denied is not None:
            self._on_denied(why)
        return _denying_handler(handler, why)


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            header = value if isinstance(value, str) else value.decode("latin-1")
            if header[: len(_SCHEME)].lower() == _SCHEME:
                return header[len(_SCHEME) :].strip()
            return None
    return None


class Principals:
    """Who is calling: the principal of the caller's token, else of its client certificate.

    With bearer tokens on, the token names the principal (the interceptor has already
    refused calls without a valid token, so the lookup only ever sees valid tokens). Else,
    with client certificates configured, a verified certificate names it: its first
    subject alternative name, or its common name when it has none. Everything else is the
    one anonymous principal.
    """

    def __init__(self, tokens: Mapping[str, str] | None = None, *, certificates: bool = False):
        self._tokens = dict(tokens or {})
        self._certificates = certificates

    @property
    def enabled(self) -> bool:
        return bool(self._tokens) or self._certificates

    def of(self, context: Any) -> str:
        if self._tokens:
            token = _bearer(context.invocation_metadata())
            principal = self._tokens.get(token) if token is not None else None
            if principal is not None:
                return principal
        if self._certificates:
            identities = context.peer_identities()
            if identities:
                first = next(iter(identities))
                return first.decode("utf-8", "replace") if isinstance(first, bytes) else first
        return ANONYMOUS


def _denying_handler(handler: Any, why: str) -> Any:
    message = (
        "missing bearer token: send the header 'authorization: Bearer <token>'"
        if why == "missing"
        else "invalid bearer token"
    )
    status = error_status(
        grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_REASON, message, {"auth": why}
    )

    async def deny(_request: Any, context: Any) -> Any:
        await context.abort_with_status(status)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
    return grpc.unary_unary_rpc_method_handler(deny, **kwargs)


__all__ = [
    "OPEN_PREFIXES",
    "UNAUTHENTICATED_REASON",
    "Principals",
    "TokenAuthInterceptor",
    "server_credentials",
]
