"""Keys by instant, for the in-process group store (``genrm_grpc.store.local_state``):
cohort deadlines and evaluation-lease expiries, the way the Redis store keeps them in a
sorted set.
"""

from __future__ import annotations

import heapq
import itertools

from genrm_grpc.cohort.model import CohortKey


class Index:
    """Keys by instant (a deadline, a lease's expiry): the due ones in O(k log n).

    A key filed again, or taken out, leaves its older heap entries behind; they are
    dropped as they reach the top.
    """

    def __init__(self) -> None:
        self.at: dict[CohortKey, float] = {}
        self._heap: list[tuple[float, int, CohortKey]] = []
        self._order = itertools.count()

    def file(self, key: CohortKey, instant: float) -> None:
        self.at[key] = instant
        heap = self._heap
        heapq.heappush(heap, (instant, next(self._order), key))
        if len(heap) > 2 * len(self.at) + 64:
            # Entries left behind are dropped by :meth:`due` as they reach the top; an
            # index nobody polls (deadlines that are timers) is rebuilt from what is
            # filed instead, so it never holds more than twice that (amortised O(1)).
            self._heap = [(at, next(self._order), k) for k, at in self.at.items()]
            heapq.heapify(self._heap)

    def refile(self, key: CohortKey, instant: float) -> None:
        """File ``key`` again only if it is filed (Redis's ``ZADD XX``)."""
        if key in self.at:
            self.file(key, instant)

    def remove(self, key: CohortKey) -> None:
        self.at.pop(key, None)

    def due(self, now: float, limit: int) -> list[CohortKey]:
        found: list[tuple[float, int, CohortKey]] = []
        seen: set[CohortKey] = set()
        heap = self._heap
        while heap and heap[0][0] <= now and len(found) < limit:
            entry = heapq.heappop(heap)
            if self.at.get(entry[2]) == entry[0] and entry[2] not in seen:
                seen.add(entry[2])
                found.append(entry)
        for entry in found:  # still filed: due until the key is filed again or removed
            heapq.heappush(heap, entry)
        return [entry[2] for entry in found]
