"""A cohort's records, and what a restart reads back of them.

The registry builds every record of a cohort: its header, members and attempt
watermark while it is active, and what ends it. The in-process group store keeps them
all and writes them to the file behind it when there is one (``memory://`` has none:
nothing outlives the process). What a restart reads back of a file is pinned here.
"""

from __future__ import annotations

from pathlib import Path

from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    MemberRecord,
    Record,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.cohort.registry import CohortRegistry
from genrm_grpc.store.sqlite import SqliteStore
from genrm_grpc.testing import ManualClock
from tests.cohort.support import T0, completed, registry
from tests.cohort.support import sub as member

from .support import Runtime, ScriptedJudge, make_runtime


def _one_group(reg: CohortRegistry) -> list[Record]:
    """Every record of a 3-member group that collects, fills and completes."""
    records: list[Record] = []
    for i in range(3):
        decision = reg.submit(member(i), T0)
        records += decision.records
    assert decision.cohort is not None
    ended = reg.evaluation_finished(decision.cohort, completed(3), T0 + 1)
    assert ended
    return records + ended.records


def test_a_group_writes_its_header_members_and_watermark_and_what_ends_it() -> None:
    reg, _ = registry()
    kinds = [type(r) for r in _one_group(reg)]
    assert kinds == [
        WatermarkRecord,  # the attempt is new
        CohortRecord,  # collecting
        MemberRecord,
        MemberRecord,
        MemberRecord,
        CohortRecord,  # evaluating
        WatermarkRecord,  # refreshed when the cohort ends
        DropCohort,
        TombstoneRecord,
    ]


def _over_file(path: Path) -> Runtime:
    """A runtime over the SQLite file at ``path`` (not opened yet)."""
    return make_runtime(ScriptedJudge(), ManualClock(), behind=SqliteStore(path))


async def _stop(runtime: Runtime) -> None:
    await runtime.shutdown(0.0)  # a file keeps the active cohorts for the next process
    await runtime.close()


async def test_a_restart_finds_the_member_of_an_active_cohort_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    runtime = _over_file(path)
    await runtime.open()
    ticket = await runtime.submit(member(0))
    await ticket.persisted()
    await _stop(runtime)

    again = SqliteStore(path)
    recovered = await again.open(0.0)
    await again.close()
    [cohort] = recovered.cohorts
    assert cohort.header.key == member(0).key
    assert [m.coords.rollout_index for m in cohort.members] == [0]
    assert [w.scope for w in recovered.watermarks] == [member(0).key.group_scope]


async def test_a_restart_counts_the_cohorts_it_restores_by_phase(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    runtime = _over_file(path)
    await runtime.open()
    for i in range(3):  # frozen: its evaluation waits on the scripted judge
        await (await runtime.submit(member(i, gid="full"))).persisted()
    await (await runtime.submit(member(0, gid="half"))).persisted()
    census = await runtime.refresh_census()
    assert (census.collecting, census.evaluating) == (1, 1)
    await _stop(runtime)

    again = _over_file(path)
    assert await again.open() == 2
    census = await again.refresh_census()
    assert (census.collecting, census.evaluating) == (1, 1)
    await _stop(again)
