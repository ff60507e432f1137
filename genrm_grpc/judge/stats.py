"""Small statistics the judge side keeps without Prometheus objects on its hot path: a
quantile of recent samples (hedge points, the adaptive budget) and bucket counts that
the metrics collectors turn into histograms at scrape time."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence


def quantile(values: Iterable[float], q: float) -> float:
    """The ceiling-rank ``q`` quantile of ``values`` (raises ValueError when empty)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


class Buckets:
    """Counts per upper bound (the last slot: above every bound) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus histogram buckets: ``(le, count at or below it)``, ``+Inf`` last."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(
            (*(str(float(b)) for b in self.bounds), "+Inf"), self.counts, strict=True
        ):
            running += count
            out.append((bound, running))
        return out


__all__ = ["Buckets", "quantile"]
