"""``SyncCohortClient``: the asyncio client driven from synchronous code.

The wrapper owns a private event loop running in a daemon thread; the ``CohortClient``
(and its grpc.aio channel) is created on that loop, and every method submits a
coroutine to it and blocks for the answer. It is thread-safe: several threads may call
it at once (their calls run concurrently on the one loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_cohort_client.client import CandidateLike, CohortClient, MemberRefLike, PromptLike
from genrm_cohort_client.options import ChannelOptions, RetryPolicy
from genrm_cohort_client.stats import ClientStats

__all__ = ["SyncCohortClient"]

T = TypeVar("T")


class SyncCohortClient:
    """Blocking twin of :class:`CohortClient` (same arguments, same errors)."""

    def __init__(
        self,
        target: str,
        *,
        options: ChannelOptions | None = None,
        retry: RetryPolicy | None = None,
        default_timeout_s: float | None = 3600.0,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="genrm-cohort-client", daemon=True
        )
        self._thread.start()

        async def build() -> CohortClient:
            return CohortClient(
                target, options=options, retry=retry, default_timeout_s=default_timeout_s
            )

        self.client = self._run(build())
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncCohortClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self.client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    @property
    def stats(self) -> ClientStats:
        """The async client's counters (see ``CohortClient.stats``)."""
        return self.client.stats

    def connect(self, timeout: float | None = None) -> None:
        """Wait for the first connection (see ``CohortClient.connect``)."""
        self._run(self.client.connect(timeout))

    def submit_member(
        self,
        member: MemberRefLike,
        prompt: PromptLike,
        candidate: CandidateLike,
        **kwargs: Any,
    ) -> pb.MemberResult:
        return self._run(self.client.submit_member(member, prompt, candidate, **kwargs))

    def compare(
        self, prompt: PromptLike, candidates: Iterable[CandidateLike], **kwargs: Any
    ) -> pb.CompareResponse:
        return self._run(self.client.compare(prompt, list(candidates), **kwargs))

    def get_cohort(self, member: MemberRefLike | str, **kwargs: Any) -> pb.CohortInfo:
        return self._run(self.client.get_cohort(member, **kwargs))

    def evaluate_group(
        self, prompt: PromptLike, candidates: Sequence[CandidateLike], **kwargs: Any
    ) -> Iterator[pb.MemberResult]:
        """Yields each member's result as it arrives (see ``CohortClient.evaluate_group``).

        ``regenerate``, if given, must be an ``async`` callable (it runs on the loop).
        """
        agen = self.client.evaluate_group(prompt, candidates, **kwargs)

        async def step() -> pb.MemberResult:
            return await agen.__anext__()

        try:
            while True:
                try:
                    yield self._run(step())
                except StopAsyncIteration:
                    return
        finally:
            self._run(agen.aclose())

    def evaluate_group_all(
        self, prompt: PromptLike, candidates: Sequence[CandidateLike], **kwargs: Any
    ) -> list[pb.MemberResult]:
        return self._run(self.client.evaluate_group_all(prompt, candidates, **kwargs))
