"""``ClientStats``: what a client's calls met (retries per reason, server restarts)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClientStats", "reason_key"]


def reason_key(code_name: str, reason: str) -> str:
    """``UNAVAILABLE/SHUTTING_DOWN``, or the code alone when there is no ErrorInfo reason."""
    return f"{code_name}/{reason}" if reason else code_name


@dataclass
class ClientStats:
    """Counters of one client (one channel), updated as calls go; read them any time.

    * ``retries``: resends in all; ``retries_by_reason``: the same per status code and
      ErrorInfo reason of the error that caused them (``UNAVAILABLE/SHUTTING_DOWN``,
      ``UNAVAILABLE`` for a transport failure without ErrorInfo, ``CANCELLED``, …);
    * ``retried_calls``: calls that needed at least one resend; ``gave_up``: calls that
      raised because their retries ran out (``max_attempts`` or ``max_elapsed_s``);
    * ``server_instance``: the ``x-genrm-server-instance`` the server sent last (None
      before the first answer, or from a server that does not send it);
      ``server_instance_changes``: how often it changed (a restarted or another server);
    * ``connect_failures``: connect attempts that failed (:class:`CohortConnectError`),
      ``connect_failures_cached``: calls that got a remembered connect failure at once.
    """

    retries: int = 0
    retries_by_reason: dict[str, int] = field(default_factory=dict)
    retried_calls: int = 0
    gave_up: int = 0
    server_instance: str | None = None
    server_instance_changes: int = 0
    connect_failures: int = 0
    connect_failures_cached: int = 0

    def count_retry(self, key: str) -> None:
        self.retries += 1
        self.retries_by_reason[key] = self.retries_by_reason.get(key, 0) + 1
