"""Open files: raise the soft ``RLIMIT_NOFILE`` to the hard limit, refuse what cannot fit.

Every judge connection, every client connection, the store, the listeners and the log
take a file descriptor. Many machines start processes with a soft limit of 1,024 while
the hard limit is far higher; a farm of judges holding thousands of calls for minutes
then fails with "Too many open files" in the middle of a step, masking whole groups. At
start the server raises the soft limit to the hard one (a process may, without
privileges), and refuses a configuration whose judge connections alone, plus a fixed
reserve for everything else, would not fit under it.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

RESERVE = 256
"""Descriptors kept for what no key bounds: client connections, listeners, the store,
its writer thread, logs, DNS lookups."""

_CEILING = 1 << 20
"""Where the hard limit is unlimited: Linux refuses a soft limit above ``fs.nr_open``
(1,048,576 by default)."""


@dataclass(frozen=True)
class NoFile:
    before: int
    soft: int
    hard: int

    @property
    def raised(self) -> bool:
        return self.soft > self.before


def raise_soft_limit() -> NoFile:
    """Raise the soft open-files limit as far as the hard limit allows; what it is now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, _CEILING)
    if soft == resource.RLIM_INFINITY or target <= soft:
        return NoFile(soft, soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return NoFile(soft, soft, hard)
    return NoFile(soft, target, hard)


def descriptors_needed(judge_max_connections: int) -> int:
    return judge_max_connections + RESERVE


def refusal(limit: NoFile, judge_max_connections: int) -> str | None:
    """The one line that refuses the configuration, or None when it fits."""
    need = descriptors_needed(judge_max_connections)
    if limit.soft == resource.RLIM_INFINITY or need <= limit.soft:
        return None
    hard = "unlimited" if limit.hard == resource.RLIM_INFINITY else str(limit.hard)
    return (
        f"judge.max_connections ({judge_max_connections}) plus {RESERVE} descriptors for "
        f"clients, listeners and the store need {need} open files, but RLIMIT_NOFILE allows "
        f"{limit.soft} (hard limit {hard}): raise the limit (ulimit -n, systemd LimitNOFILE=, "
        "a container's nofile ulimit) or lower judge.max_connections"
    )
