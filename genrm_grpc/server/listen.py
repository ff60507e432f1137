"""Where the server listens and how gRPC is set up there: the channel options (message
size, streams, pending calls, keepalive, connection lifetime) and the check that the
address can be bound, made before anything is served (``server.app`` uses both).
"""

from __future__ import annotations

import errno
import socket

from genrm_grpc.config import Settings

# Keepalive policy. Collectors ping every 30 s to keep idle channels through NATs and
# load balancers alive: the server accepts pings down to every 20 s (two strikes, then
# GOAWAY), and pings idle clients itself every 60 s to drop dead connections.
KEEPALIVE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 2),
)


def server_options(settings: Settings) -> list[tuple[str, int]]:
    # gRPC's own hard limit sits above ours so oversized members get our typed error.
    hard_limit = settings.max_message_bytes * 2 + (1 << 20)
    options = [
        ("grpc.max_receive_message_length", hard_limit),
        ("grpc.max_send_message_length", hard_limit),
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
        # grpc-core's pending queue (arrived, not yet picked up): past the soft limit it
        # refuses calls at random, past the hard one always, each with a bare CANCELLED.
        ("grpc.server.max_pending_requests", settings.max_pending_rpcs),
        ("grpc.server.max_pending_requests_hard_limit", settings.max_pending_rpcs),
        # grpcio turns SO_REUSEPORT on by default, so a second server on a busy port
        # starts and silently takes part of the traffic. Only on explicit request.
        ("grpc.so_reuseport", int(settings.listen_reuse_port)),
        *KEEPALIVE_OPTIONS,
    ]
    # Connection lifetime (off unless configured): after max_connection_age_s a client
    # gets GOAWAY and reconnects (spreading load over new replicas); calls still running
    # get max_connection_age_grace_s to finish. An idle connection is closed after
    # max_connection_idle_s.
    for key, seconds in (
        ("grpc.max_connection_age_ms", settings.max_connection_age_s),
        ("grpc.max_connection_age_grace_ms", settings.max_connection_age_grace_s),
        ("grpc.max_connection_idle_ms", settings.max_connection_idle_s),
    ):
        if seconds is not None:
            options.append((key, max(1, round(seconds * 1000))))
    return options


class ListenError(OSError):
    """The server cannot listen on its address; the message is one line."""


def _split_host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def check_listen(listen: str, *, reuse_port: bool, what: str = "listen") -> None:
    """Bind (and release) ``listen`` as the server will, to refuse a busy or foreign address.

    gRPC only reports "Failed to bind" (the cause goes to its own log), so the address is
    tried with a plain socket first: the operator gets the operating system's reason in
    one line. Port 0 (any free port) always passes.
    """
    host, port = _split_host_port(listen)
    if port == 0:
        return
    label = "" if what == "listen" else f" ({what})"
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {listen}{label}: {exc.strerror}") from None
    failures: list[OSError] = []
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port and hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                failures.append(exc)
    # A port in use anywhere is refused. Other failures only matter when no address
    # binds: gRPC serves on the addresses it can (``localhost`` without IPv6, say).
    busy = [exc for exc in failures if exc.errno == errno.EADDRINUSE]
    if busy or (failures and len(failures) == len(infos)):
        first = (busy or failures)[0]
        reason = (first.strerror or str(first)).lower()
        hint = ""
        if busy and what == "listen":
            hint = (
                " (another process listens there; stop it, pick another port, or set "
                "listen_reuse_port: true to share the port on purpose)"
            )
        raise ListenError(f"cannot listen on {listen}{label}: {reason}{hint}")
