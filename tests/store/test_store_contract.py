"""What every durable store must do, run against each backend: SQLite and a real Redis.

These tests are about the records' meaning (what survives a reopen, expiry, watermarks
that only rise, drops, verdict reuse), not about files or connections; each backend's
own failure modes are tested in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from genrm_grpc.cohort.model import (
    CohortKey,
    Completed,
    Failed,
    Masked,
    MemberCoords,
    MemberReward,
    Phase,
)
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    TombstoneRecord,
    WatermarkRecord,
)
from genrm_grpc.scoring.types import AnswerTexts
from genrm_grpc.store.durable import DurableStore
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.redis import RedisStore
from genrm_grpc.store.sqlite import SqliteStore
from tests.store.samples import (
    CTX,
    KEY,
    LEGACY,
    NOW,
    PROMPT,
    completed,
    digest,
    scope_of,
    tombstone,
    verdict_record,
)

MakeStore = Callable[[], DurableStore]


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    """A factory of stores over the same storage: a second one sees what the first wrote."""
    if request.param == "sqlite":
        path = tmp_path / "state.sqlite3"
        return lambda: SqliteStore(path)
    url: str = request.getfixturevalue("redis_url")
    return lambda: RedisStore(url)


async def reopened(make_store: MakeStore) -> tuple[DurableStore, object]:
    store = make_store()
    return store, await store.open(NOW)


async def test_every_record_kind_survives_closing_and_reopening(make_store: MakeStore) -> None:
    store = make_store()
    assert (await store.open(NOW)).cohorts == ()
    header = CohortRecord(KEY, 3, 2, PROMPT, "pd", Phase.COLLECTING, NOW, NOW + 1800)
    member = MemberRecord(
        KEY, MemberCoords(1, "group-a", 1, None, None, 2), digest(2), AnswerTexts("why", "4")
    )
    done_key = CohortKey("group-b", None, 0)
    await store.persist(
        [
            header,
            member,
            TombstoneRecord(tombstone(done_key, completed()), NOW + 3600),
            TombstoneRecord(tombstone(LEGACY, Masked("judge down", {"x": 1.0})), NOW + 3600),
            TombstoneRecord(tombstone(CohortKey("c", None, 0), Failed("late", True)), NOW + 60),
            WatermarkRecord("group-a", 1, NOW + 3600),
            verdict_record(KEY, 0, 1),
        ]
    )
    await store.close()

    again = make_store()
    recovered = await again.open(NOW)
    try:
        assert [c.header for c in recovered.cohorts] == [header]
        assert recovered.cohorts[0].members == (member,)
        outcomes = {t.tombstone.key: t.tombstone.outcome for t in recovered.tombstones}
        assert outcomes == {
            CohortKey("c", None, 0): Failed("late", True),
            done_key: completed(),
            LEGACY: Masked("judge down", {"x": 1.0}),
        }
        assert [t.expires_at for t in recovered.tombstones] == [NOW + 60, NOW + 3600, NOW + 3600]
        kept = recovered.tombstones[1].tombstone
        assert kept.digests == {0: digest(1), 1: digest(2)}
        assert kept.prompt_digest == "pd" and kept.finished_at == NOW
        assert recovered.watermarks == (WatermarkRecord("group-a", 1, NOW + 3600),)
        assert recovered.verdicts == (verdict_record(KEY, 0, 1),)
    finally:
        await again.close()


async def test_active_cohorts_come_back_in_order_with_their_members_in_slot_order(
    make_store: MakeStore,
) -> None:
    store = make_store()
    await store.open(NOW)
    keys = [CohortKey(f"g{n}", None, 0, "alice") for n in range(3)]
    headers = [
        CohortRecord(key, seq, 3, PROMPT, "pd", Phase.EVALUATING, NOW, NOW + 5, NOW + 60)
        for key, seq in zip(keys, (7, 2, 5), strict=True)
    ]
    members = [
        MemberRecord(key, MemberCoords(slot), digest(slot), AnswerTexts("", f"a{slot}"))
        for key in keys
        for slot in (2, 0, 1)
    ]
    await store.persist([*headers, *members])
    await store.close()
    again, recovered = await reopened(make_store)
    await again.close()
    assert [c.header.key for c in recovered.cohorts] == [keys[1], keys[2], keys[0]]  # type: ignore[attr-defined]
    for cohort in recovered.cohorts:  # type: ignore[attr-defined]
        assert [m.coords.rollout_index for m in cohort.members] == [0, 1, 2]


async def test_a_hand_built_outcome_keeps_its_own_comparison_lists(make_store: MakeStore) -> None:
    base = completed()
    odd = Completed(
        rewards=(
            MemberReward(1.0, 1.0, 1.0, 0.0, (base.judged[1],)),
            MemberReward(2.0, 2.0, 2.0, 0.0, ()),
        ),
        metrics={},
        judged=base.judged,
    )
    store, _ = await reopened(make_store)
    await store.persist([TombstoneRecord(tombstone(KEY, odd), NOW + 10)])
    await store.close()
    again, recovered = await reopened(make_store)
    await again.close()
    assert recovered.tombstones[0].tombstone.outcome == odd  # type: ignore[attr-defined]


async def test_expired_tombstones_are_not_read_back(make_store: MakeStore) -> None:
    store, _ = await reopened(make_store)
    await store.persist(
        [
            TombstoneRecord(tombstone(CohortKey("old", None, 0), Failed("x")), NOW - 1),
            TombstoneRecord(tombstone(CohortKey("new", None, 0), Failed("x")), NOW + 1),
        ]
    )
    await store.close()
    again, recovered = await reopened(make_store)
    await again.close()
    assert [t.tombstone.key.group_id for t in recovered.tombstones] == ["new"]  # type: ignore[attr-defined]


async def test_watermarks_only_rise(make_store: MakeStore) -> None:
    store, _ = await reopened(make_store)
    await store.persist([WatermarkRecord("g", 5, NOW + 10)])
    await store.persist([WatermarkRecord("g", 3, NOW + 20)])
    await store.persist([WatermarkRecord("h", 2, NOW + 30), WatermarkRecord("h", 9, NOW + 30)])
    await store.close()
    again, recovered = await reopened(make_store)
    await again.close()
    assert recovered.watermarks == (  # type: ignore[attr-defined]
        WatermarkRecord("g", 5, NOW + 20),
        WatermarkRecord("h", 9, NOW + 30),
    )


async def test_drops_remove_records_and_the_verdicts_that_belong_to_them(
    make_store: MakeStore,
) -> None:
    store, _ = await reopened(make_store)
    other = CohortKey("group-b", None, 0)
    header = CohortRecord(KEY, 1, 2, PROMPT, "pd", Phase.EVALUATING, NOW, NOW + 5, NOW + 60)
    await store.persist(
        [
            header,
            MemberRecord(KEY, MemberCoords(0), digest(1), AnswerTexts("", "a")),
            verdict_record(KEY, 0, 1),
            verdict_record(LEGACY, 0, 1),
            verdict_record(other, 0, 1),
            TombstoneRecord(tombstone(other, completed()), NOW + 100),
            WatermarkRecord("group-b", 0, NOW + 100),
        ]
    )
    await store.persist(
        [
            DropCohort(KEY),  # keeps its verdicts: a later attempt may reuse them
            DropCohort(LEGACY, keep_verdicts=False),
            DropTombstone(other),
            DropWatermark("group-b"),
        ]
    )
    kept = await store.find_verdict(scope_of(KEY), CTX, digest(0), digest(1), 0, False)
    assert kept == verdict_record(KEY, 0, 1)
    assert await store.find_verdict(scope_of(other), CTX, digest(0), digest(1), 0, False) is None
    await store.close()
    again, recovered = await reopened(make_store)
    try:
        assert recovered.cohorts == () and recovered.tombstones == ()  # type: ignore[attr-defined]
        assert recovered.watermarks == ()  # type: ignore[attr-defined]
        # Only active cohorts' verdicts are read at start-up; the rest stay findable.
        assert recovered.verdicts == ()  # type: ignore[attr-defined]
        found = await again.find_verdict(scope_of(KEY), CTX, digest(0), digest(1), 0, False)
        assert found == verdict_record(KEY, 0, 1)
    finally:
        await again.close()


async def test_another_attempts_verdict_keeps_serving_when_one_attempt_is_dropped(
    make_store: MakeStore,
) -> None:
    first, second = CohortKey("g", None, 0), CohortKey("g", None, 1)
    scope = scope_of(first)
    store, _ = await reopened(make_store)
    try:
        for k in (0, 1):  # judge index 1 is a swapped pass
            await store.persist([verdict_record(first, 0, 1, k), verdict_record(second, 0, 1, k)])
        await store.persist([DropTombstone(first)])
        for k in (0, 1):
            found = await store.find_verdict(scope, CTX, digest(0), digest(1), k, k == 1)
            assert found == verdict_record(second, 0, 1, k)
        await store.persist([DropTombstone(second)])
        for k in (0, 1):
            assert await store.find_verdict(scope, CTX, digest(0), digest(1), k, k == 1) is None
    finally:
        await store.close()


async def test_reuse_lookups_need_the_same_question(make_store: MakeStore) -> None:
    store, _ = await reopened(make_store)
    await store.persist([verdict_record(KEY, 0, 1), verdict_record(LEGACY, 0, 1)])
    scope = scope_of(KEY)
    try:
        assert await store.find_verdict(scope, CTX, digest(0), digest(1), 0, False) is not None
        assert await store.find_verdict(scope, CTX, digest(1), digest(0), 0, False) is None
        assert await store.find_verdict(scope, CTX, digest(0), digest(1), 0, True) is None
        assert await store.find_verdict(scope, "d8" * 32, digest(0), digest(1), 0, False) is None
        other_principal = scope_of(CohortKey("group-a", None, 1, "mallory"))
        assert (
            await store.find_verdict(other_principal, CTX, digest(0), digest(1), 0, False) is None
        )
        # The legacy verdict (no scope) is never found by a reuse lookup.
        assert await store.find_verdict("t7:abc", CTX, digest(0), digest(1), 0, False) is None
    finally:
        await store.close()


async def test_persisting_to_a_closed_store_fails(make_store: MakeStore) -> None:
    store, _ = await reopened(make_store)
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.persist([WatermarkRecord("g", 1, NOW)])
