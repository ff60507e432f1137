"""Sample records shared by the store tests (every backend)."""

from __future__ import annotations

import time

from genrm_grpc.cohort.model import (
    CohortKey,
    Completed,
    Failed,
    Masked,
    MemberReward,
    PromptSpec,
    Tombstone,
)
from genrm_grpc.cohort.records import VerdictRecord
from genrm_grpc.cohort.registry import CohortRegistry
from genrm_grpc.config import Settings
from genrm_grpc.scoring.types import JudgedPair, Verdict
from genrm_grpc.store.group_state import GroupState
from genrm_grpc.store.memory import MemoryStore

NOW = 1_800_000_000.0
PROMPT = PromptSpec((("user", "What is 2+2?"), ("assistant", "hm")), "be right", None)
KEY = CohortKey("group-a", None, 1)
LEGACY = CohortKey(None, "t7:abc", 0)
CTX = "c7" * 32


def decide_on(state: GroupState, settings: Settings) -> tuple[CohortRegistry, float]:
    """A registry holding only ``state``'s group, as a replica decides on it, and now."""
    registry = CohortRegistry(settings, MemoryStore(settings))
    now = time.time()
    registry.restore(state.recovered, now)
    return registry, now


def digest(n: int) -> str:
    return f"{n:064x}"


def scope_of(key: CohortKey) -> str:
    scope = key.group_scope
    assert scope is not None
    return scope


def verdict_record(cohort: CohortKey, i: int, j: int, k: int = 0) -> VerdictRecord:
    """A journaled pass; its scope is the cohort's group scope (None for legacy keys)."""
    return VerdictRecord(
        cohort=cohort,
        scope=cohort.group_scope,
        context=CTX,
        first=digest(i),
        second=digest(j),
        judge_index=k,
        swap=k % 2 == 1,
        response_i=i,
        response_j=j,
        verdict=Verdict(4.0, 2.5, 2.0, parse_failed=False),
        usage=(100, 2000, 1500),
        finished_at=NOW,
    )


def completed() -> Completed:
    judged = (
        JudgedPair(0, 1, 0, Verdict(4.0, 3.0, 2.0)),
        JudgedPair(1, 0, 0, Verdict(3.0, 3.0, 3.5, parse_failed=True)),
    )
    return Completed(
        rewards=(
            MemberReward(3.75, 3.5, 3.5, 0.25, (judged[0], judged[1])),
            MemberReward(3.0, 3.0, 3.0, 0.0, (judged[0], judged[1])),
        ),
        metrics={"mean_individual_score": 3.25, "tiebreak_usage_rate": 0.5},
        judged=judged,
    )


def tombstone(key: CohortKey, outcome: Completed | Masked | Failed) -> Tombstone:
    return Tombstone(key, 2, "pd", {0: digest(1), 1: digest(2)}, outcome, finished_at=NOW)
