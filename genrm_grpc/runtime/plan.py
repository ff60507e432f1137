"""Which judge calls a cohort needs, planned lazily: no work before the members exist.

A cohort of ``n`` members needs ``pass_count(n)`` judge calls ("passes"): every pair
of its comparison strategy, once per judge (``fixed_baseline``: every member against
the baseline, once per judge). Each pass has a fixed ``order``, its position in the
aggregation order of :func:`genrm_grpc.scoring.judge_passes`, computed arithmetically,
so a pass can be planned on its own:

- :func:`passes_with` yields only the passes of one member whose partners are present
  (``judge_schedule: eager``), so an arriving member costs work for its own pairs and
  a cohort holds memory for what has arrived, never for the size it declared;
- :func:`all_passes` yields every pass of a complete cohort as a generator, so the
  caller can start them in slices and yield to the event loop in between.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Literal

from genrm_grpc.scoring.types import ComparisonStrategy

ComparisonMode = Literal["rollout_cohort", "fixed_baseline"]


@dataclass(frozen=True, slots=True)
class Pass:
    """One judge call: members ``i`` and ``j`` (``j == n``: the baseline), judge ``k``."""

    order: int
    i: int
    j: int
    judge_index: int
    swap: bool


@dataclass(frozen=True, slots=True)
class PassPlan:
    mode: ComparisonMode
    strategy: ComparisonStrategy
    judges: int
    #: Odd judge passes swap the answers (position debiasing, with ≥ 2 judges).
    debias: bool = False

    @classmethod
    def of(
        cls, mode: ComparisonMode, strategy: ComparisonStrategy, judges: int, position_debias: bool
    ) -> PassPlan:
        """The plan for a configuration (position_debias needs at least two judges)."""
        return cls(mode, strategy, judges, debias=position_debias and judges >= 2)

    def pair_count(self, n: int) -> int:
        if self.mode == "fixed_baseline":
            return n
        if n < 2:
            return 0
        return n if self.strategy == "circular" else n * (n - 1) // 2

    def pass_count(self, n: int) -> int:
        """Judge calls a complete cohort of ``n`` members needs (O(1))."""
        return self.pair_count(n) * self.judges

    def describe(self) -> str:
        what = "baseline" if self.mode == "fixed_baseline" else self.strategy
        return f"{what} × {self.judges} judge(s)"

    def _pass(self, n: int, index: int, i: int, j: int, k: int) -> Pass:
        order = k * self.pair_count(n) + index
        if self.mode == "fixed_baseline":
            # The member sits on alternate sides so the judge's position bias cancels.
            return Pass(order, i, j, k, swap=(i + k) % 2 == 1)
        return Pass(order, i, j, k, swap=self.debias and k % 2 == 1)

    def _pairs_with(self, n: int, m: int, present: Collection[int]) -> list[tuple[int, int, int]]:
        """(index, first, second) of the pairs of member ``m`` whose partner is present."""
        if self.mode == "fixed_baseline":
            return [(m, m, n)]
        if n < 2:
            return []
        if self.strategy == "circular":
            if n == 2:
                pairs = [(0, 0, 1), (1, 1, 0)]
            else:
                before = (m - 1) % n
                pairs = [(before, before, m), (m, m, (m + 1) % n)]
            return [p for p in pairs if p[1] in present and p[2] in present]
        out = []
        for other in present:
            if other == m:
                continue
            i, j = min(m, other), max(m, other)
            out.append((i * n - i * (i + 1) // 2 + (j - i - 1), i, j))
        return out

    def passes_with(self, n: int, m: int, present: Collection[int]) -> Iterator[Pass]:
        """The passes of member ``m`` whose partners are all in ``present`` (eager)."""
        pairs = self._pairs_with(n, m, present)
        for k in range(self.judges):
            for index, i, j in pairs:
                yield self._pass(n, index, i, j, k)

    def all_passes(self, n: int) -> Iterator[Pass]:
        """Every pass of a complete cohort, in aggregation order (lazily)."""
        for k in range(self.judges):
            if self.mode == "fixed_baseline":
                for m in range(n):
                    yield self._pass(n, m, m, n, k)
            elif n >= 2 and self.strategy == "circular":
                for i in range(n):
                    yield self._pass(n, i, i, (i + 1) % n, k)
            else:
                index = 0
                for i in range(n):
                    for j in range(i + 1, n):
                        yield self._pass(n, index, i, j, k)
                        index += 1
