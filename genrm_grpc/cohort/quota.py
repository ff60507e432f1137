"""The one rule every in-flight work bound shares: a request alone is always admitted.

A bound on work in flight (judge passes of Compare calls, per principal or for the
server) refuses a request whose cost would take the total past the limit, except when
nothing is in flight: a request larger than the limit on its own would otherwise be
refused forever. Its size is bounded elsewhere (``max_compare_candidates``).
"""

from __future__ import annotations


def admits(in_flight: int, cost: int, limit: int) -> bool:
    """Whether work of ``cost`` may start while ``in_flight`` is running under ``limit``."""
    return not in_flight or in_flight + cost <= limit
