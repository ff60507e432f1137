"""The adaptive output budget: stop paying for verdicts that run far past convergence.

A GenRM verdict either converges (NeMo Gym #3303 measured roughly 8-10k output tokens)
or runs away and spends whatever ``max_output_tokens`` allows. A runaway attempt yields
no verdict and is retried, so every token of it is waste. :class:`AdaptiveBudget`
learns how long *converging* attempts of this judge (one model, one wire format: one
client) run, from the output lengths of attempts that produced a verdict, and proposes
a budget for the next attempts: a high quantile of those lengths times a margin, never
above the configured cap, never below a floor, and only once it has enough samples.

The sample is bounded and recent (the last ``window`` verdicts), so the budget follows
a judge whose behaviour drifts (a new checkpoint, another temperature). The quantile is
recomputed every ``1/8`` of the window's worth of new samples, not per attempt (a
sort). Sans-IO: the client feeds it and asks it; the rule that the last retry of a
comparison whose every attempt was cut goes out with the full cap is the client's
(``Tally.next_limit`` in ``judge/attempts.py``).
"""

from __future__ import annotations

import math
from collections import deque

from genrm_grpc.judge.stats import Buckets, quantile
from genrm_grpc.judge.views import JudgeBlockView


class AdaptiveBudget:
    def __init__(
        self,
        *,
        cap: int | None,
        quantile: float = 0.99,
        margin: float = 1.2,
        floor: int = 1024,
        min_samples: int = 64,
        window: int = 1024,
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if margin < 1:
            raise ValueError(f"margin must be >= 1, got {margin}")
        if min_samples < 1 or window < min_samples:
            raise ValueError("need 1 <= min_samples <= window")
        self.cap = cap
        self.quantile = quantile
        self.margin = margin
        self.floor = floor
        self.min_samples = min_samples
        self._lengths: deque[int] = deque(maxlen=window)
        self._every = max(1, window // 8)
        self._since = 0
        self._current: int | None = None

    @property
    def samples(self) -> int:
        return len(self._lengths)

    def observe(self, output_tokens: int) -> None:
        """An attempt that produced a verdict used this many output tokens."""
        if output_tokens <= 0:
            return
        self._lengths.append(output_tokens)
        self._since += 1
        if len(self._lengths) < self.min_samples:
            return
        if self._current is None or self._since >= self._every:
            self._since = 0
            self._current = self._compute()

    def _compute(self) -> int:
        budget = max(self.floor, math.ceil(quantile(self._lengths, self.quantile) * self.margin))
        return budget if self.cap is None else min(self.cap, budget)

    def current(self) -> int | None:
        """The budget to send, or None until enough verdicts are known (send the cap)."""
        return self._current

    def cuts(self) -> bool:
        """Whether the current budget is below the cap (it can cut an attempt short)."""
        return self._current is not None and (self.cap is None or self._current < self.cap)


#: Upper bounds (tokens) of the output-tokens-per-verdict histogram.
TOKEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536)


class TokenLedger:
    """Output tokens a judge client spent, read by the metrics at scrape time.

    ``per_verdict``: a histogram of the output tokens of the attempt
    that produced each verdict; ``wasted``: output tokens of attempts that produced none
    (runaways cut by a budget, unparseable answers); ``adaptive_cuts``: attempts that
    ran out of an adaptive budget below the configured cap; ``streamed_in_flight``:
    output tokens streamed so far by requests still in flight (``judge.stream``);
    ``first_token_timeouts``: streamed requests that sent no first token in time.
    """

    def __init__(self) -> None:
        self.per_verdict = Buckets(TOKEN_BUCKETS)
        self.wasted = 0
        self.adaptive_cuts = 0
        self.streamed_in_flight = 0
        self.first_token_timeouts = 0

    def verdict(self, output_tokens: int) -> None:
        self.per_verdict.observe(output_tokens)


__all__ = ["TOKEN_BUCKETS", "AdaptiveBudget", "TokenLedger"]


def adaptive_budget(judge: JudgeBlockView) -> AdaptiveBudget | None:
    """``judge.adaptive_budget``'s estimator, configured by the judge block; None when off."""
    if not judge.adaptive_budget:
        return None
    return AdaptiveBudget(
        cap=judge.max_output_tokens,
        quantile=judge.adaptive_budget_quantile,
        margin=judge.adaptive_budget_margin,
        floor=judge.adaptive_budget_floor,
        min_samples=judge.adaptive_budget_min_samples,
    )
