"""Channel and retry options: keepalive, message limits, TLS, bearer token, backoff."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "ChannelOptions", "RetryPolicy", "make_channel"]

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ChannelOptions:
    """How the client's one channel is built.

    Keepalive matches the server's policy (it permits pings every >= 20 s without
    data): a ping every 30 s, 10 s to answer, also while no call is active, with no
    limit on pings without data. ``connect_timeout_s`` bounds the wait for the *first*
    connection: when nothing answers at the address within it, calls raise
    :class:`~genrm_cohort_client.CohortConnectError` instead of waiting until their
    deadline; ``None`` waits as long as the call's deadline allows (for a server that is
    still starting). A connect failure is remembered for ``connect_failure_ttl_s``
    (5 s; 0 = not at all): calls in that time raise the same error at once instead of
    each waiting ``connect_timeout_s`` again against a dead address (an explicit
    ``connect(timeout=...)`` always tries anew). Once connected, ``wait_for_ready``
    makes calls wait for a reconnection instead of failing at once.
    TLS is on when ``tls`` is true or any certificate is given; ``client_cert_chain`` +
    ``client_private_key`` (PEM) enable mutual TLS. ``bearer_token`` is sent as
    ``authorization: Bearer <token>`` metadata on every call (use TLS outside loopback).
    """

    max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    keepalive_time_ms: int = 30_000
    keepalive_timeout_ms: int = 10_000
    keepalive_permit_without_calls: bool = True
    wait_for_ready: bool = True
    connect_timeout_s: float | None = 5.0
    initial_reconnect_backoff_ms: int = 1_000
    max_reconnect_backoff_ms: int = 10_000
    tls: bool = False
    root_certificates: bytes | None = None
    client_private_key: bytes | None = None
    client_cert_chain: bytes | None = None
    server_name_override: str | None = None
    bearer_token: str | None = None
    connect_failure_ttl_s: float = 5.0
    user_agent: str = "genrm-cohort-client/0.2"
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if (self.client_private_key is None) != (self.client_cert_chain is None):
            raise ValueError("mutual TLS needs both client_private_key and client_cert_chain")
        if self.connect_timeout_s is not None and not 0 < self.connect_timeout_s < float("inf"):
            raise ValueError("connect_timeout_s must be > 0 and finite (or None to wait)")
        if not 0 <= self.connect_failure_ttl_s < float("inf"):
            raise ValueError("connect_failure_ttl_s must be >= 0 and finite")
        for name in ("max_send_message_bytes", "max_receive_message_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    @property
    def secure(self) -> bool:
        return bool(
            self.tls or self.root_certificates or self.client_cert_chain or self.client_private_key
        )

    def grpc_options(self) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", self.initial_reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", self.initial_reconnect_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", self.max_reconnect_backoff_ms),
            ("grpc.primary_user_agent", self.user_agent),
        ]
        if self.server_name_override:
            options.append(("grpc.ssl_target_name_override", self.server_name_override))
        options.extend(self.extra)
        return options

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.bearer_token:
            return (("authorization", f"Bearer {self.bearer_token}"),)
        return ()


def make_channel(target: str, options: ChannelOptions) -> grpc.aio.Channel:
    """An aio channel for ``target`` (must be called with the event loop that will use it)."""
    if options.secure:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=options.root_certificates,
            private_key=options.client_private_key,
            certificate_chain=options.client_cert_chain,
        )
        return grpc.aio.secure_channel(target, credentials, options=options.grpc_options())
    return grpc.aio.insecure_channel(target, options=options.grpc_options())


@dataclass(frozen=True)
class RetryPolicy:
    """When and how often the *same* submission is resent (tenacity under the hood).

    * ``UNAVAILABLE`` (transport failure, server draining or restarting, any reason such
      as ``SHUTTING_DOWN`` or ``SERVER_OVERLOADED``), and ``SERVER_OVERLOADED`` under
      any code, is retried with exponential backoff (``initial_backoff_s`` doubling up
      to ``max_backoff_s``) plus up to ``jitter_s`` of random jitter, at most
      ``max_attempts`` calls in all. Resending is safe: an identical member reattaches
      to its cohort or replays its cached result.
    * ``CANCELLED`` that the caller did not cause (no ErrorInfo, the client not closed:
      e.g. a server's gRPC core refusing calls beyond its pending-call queue under a
      burst) is retried like UNAVAILABLE. A caller's own cancellation is never resent.
    * ``DEADLINE_EXCEEDED`` is *not* retried by default: the per-call deadline is the
      caller's budget. With ``retry_deadline_exceeded`` it is retried like UNAVAILABLE,
      but only when the status carries no ErrorInfo (i.e. it was the transport deadline).
    * ``ABORTED`` is never resent as is (the group attempt failed); see
      ``CohortClient.evaluate_group(max_group_attempts=...)`` for replacement groups.
    * ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``, ``ALREADY_EXISTS`` and everything
      else are never retried.

    ``max_elapsed_s`` (900 s; ``None``: no limit) bounds the time a call spends
    *retrying*: it counts from the call's first retryable failure, covers the backoff
    sleeps and the wait for a lost server to come back (with
    ``ChannelOptions.wait_for_ready``), and when it is spent the call raises the last
    error. The wait of an attempt that reached a server (a member waiting for its
    cohort) is bounded by the call's ``timeout`` instead.

    A call that retries logs a WARNING (logger ``genrm_cohort_client``) on its first
    retry and then at most every ``warn_every_s`` (60 s) while it goes on retrying or
    waiting for the server: which call (method, group id, attempt, slots), why (status
    code and ErrorInfo reason), how long so far and how long it will go on; a call that
    gives up logs that too. ``CohortClient.stats`` counts the retries per reason.
    ``on_retry(error, calls_so_far, sleep_s)`` is called before each backoff sleep.
    """

    max_attempts: int = 8
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    jitter_s: float = 0.2
    max_elapsed_s: float | None = 900.0
    retry_deadline_exceeded: bool = False
    warn_every_s: float = 60.0
    on_retry: Callable[[Exception, int, float], None] | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.jitter_s < 0:
            raise ValueError("backoff and jitter must be >= 0")
        if self.max_elapsed_s is not None and not 0 < self.max_elapsed_s < float("inf"):
            raise ValueError("max_elapsed_s must be > 0 and finite (or None: no limit)")
        if not 0 < self.warn_every_s < float("inf"):
            raise ValueError("warn_every_s must be > 0 and finite")


def checked_retry(value: object) -> RetryPolicy | None:
    """``value`` when it is a :class:`RetryPolicy` or None; a clear TypeError otherwise.

    ``retry=`` takes a policy, not a set of status codes (``NEVER_RETRY`` and its
    siblings in ``errors`` classify errors, they do not configure resending), so a wrong
    argument fails where it is passed instead of deep inside a call.
    """
    if value is None or isinstance(value, RetryPolicy):
        return value
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise TypeError(
        f"retry= takes a RetryPolicy or None, not {type(value).__name__} ({shown}); "
        "to never resend, pass RetryPolicy(max_attempts=1)"
    )
