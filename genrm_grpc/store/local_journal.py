"""Where the in-process group store's evaluations journal their passes
(``store/local.py``, ``LocalGroups.store``): lease-fenced, written to the file behind
first when there is one, held once written."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from genrm_grpc.cohort.records import Record, VerdictRecord
from genrm_grpc.store.durable import DurableStore
from genrm_grpc.store.lease import Lease, LeaseLostError
from genrm_grpc.store.records import StoreError

if TYPE_CHECKING:
    from genrm_grpc.store.local import LocalGroups


class LocalJournal:
    """Where evaluations journal their passes, fenced by their lease (module doc)."""

    def __init__(self, groups: LocalGroups, behind: DurableStore | None) -> None:
        self._groups = groups
        self._behind = behind
        #: With nothing behind, nothing outlives the process (a drain fails the cohorts).
        self.survives_restart = behind is not None and behind.survives_restart

    @property
    def write_failures(self) -> int:
        return 0  # a failed write to the file behind is counted in its groups' stats

    async def start(self) -> None:
        return None  # the file behind is opened, and read back, by LocalGroups.connect

    async def close(self) -> None:
        if self._behind is not None:
            await self._behind.close()

    def persist(
        self, records: Sequence[Record], *, lease: Lease | None = None
    ) -> asyncio.Future[None]:
        """Journal ``records`` (passes) while ``lease`` is current: written to the file
        behind first, held once written; the future resolves then."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        held = self._groups.state
        if lease is not None and not self._groups.holds(lease):
            written.set_exception(
                LeaseLostError(
                    f"the lease {lease.token} of a group is no longer current: nothing written"
                )
            )
        elif self._behind is None:
            held.apply(records)
            written.set_result(None)
        else:

            def done(write: asyncio.Future[None]) -> None:
                error = write.exception() if not write.cancelled() else StoreError("cancelled")
                if error is not None:
                    self._groups.stats.failures += 1
                    written.set_exception(error)
                    return
                held.apply(records)
                written.set_result(None)

            self._behind.persist(records).add_done_callback(done)
        return written

    async def find_verdict(
        self, scope: str, context: str, first: str, second: str, judge_index: int, swap: bool
    ) -> VerdictRecord | None:
        if self._behind is not None:  # it keeps every attempt's verdicts; memory not all
            return await self._behind.find_verdict(scope, context, first, second, judge_index, swap)
        return self._groups.state.journal.reusable(scope, context, first, second, judge_index, swap)
