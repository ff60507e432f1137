"""Builders shared by the cohort-core tests: submissions, registries, outcomes."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from genrm_grpc.cohort.identity import CandidateInput, ComparisonMode, resolve
from genrm_grpc.cohort.model import (
    Cohort,
    Completed,
    MemberCoords,
    MemberReward,
    PromptSpec,
    Rejection,
    Submission,
)
from genrm_grpc.cohort.registry import CohortRegistry
from genrm_grpc.config import Settings
from genrm_grpc.store.memory import MemoryStore

PROMPT = PromptSpec(messages=(("system", "Be brief."), ("user", "Name the largest planet.")))
OTHER_PROMPT = PromptSpec(messages=(("user", "Name the smallest planet."),))

COLLECTION_S = 100.0
EVALUATION_S = 50.0
T0 = 1000.0


def answer(i: int, variant: str = "") -> str:
    return f"answer {i}{variant}: Jupiter"


def sub(
    i: int,
    *,
    gid: str | None = "g",
    attempt: int | None = 0,
    size: int | None = 3,
    text: str | None = None,
    prompt: PromptSpec = PROMPT,
    task_index: int | None = None,
    prompt_id: str | None = None,
    candidate: CandidateInput | None = None,
    default_group_size: int = 3,
    mode: ComparisonMode = "rollout_cohort",
) -> Submission:
    """A valid submission for slot ``i`` (fails the test if it does not resolve)."""
    got = resolve_member(
        i,
        gid=gid,
        attempt=attempt,
        size=size,
        text=text,
        prompt=prompt,
        task_index=task_index,
        prompt_id=prompt_id,
        candidate=candidate,
        default_group_size=default_group_size,
        mode=mode,
    )
    assert isinstance(got, Submission), got
    return got


def resolve_member(
    i: int,
    *,
    gid: str | None = "g",
    attempt: int | None = 0,
    size: int | None = 3,
    text: str | None = None,
    prompt: PromptSpec = PROMPT,
    task_index: int | None = None,
    prompt_id: str | None = None,
    candidate: CandidateInput | None = None,
    default_group_size: int = 3,
    mode: ComparisonMode = "rollout_cohort",
) -> Submission | Rejection:
    coords = MemberCoords(
        rollout_index=i,
        group_id=gid,
        group_attempt=attempt,
        task_index=task_index,
        prompt_id=prompt_id,
        group_size=size,
    )
    if candidate is None:
        candidate = CandidateInput(
            output_text=answer(i) if text is None else text, reasoning_text="thinking"
        )
    return resolve(coords, prompt, candidate, default_group_size=default_group_size, mode=mode)


def registry(
    *,
    collection_s: float = COLLECTION_S,
    evaluation_s: float = EVALUATION_S,
    max_active: int = 10_000,
    ttl_s: float = 3600.0,
    max_records: int = 4096,
) -> tuple[CohortRegistry, MemoryStore]:
    settings = Settings(
        cohort_collection_timeout_s=collection_s,
        cohort_evaluation_timeout_s=evaluation_s,
        max_active_cohorts=max_active,
        cohort_result_ttl_s=ttl_s,
        max_terminal_cohorts=max_records,
    )
    store = MemoryStore(settings)
    reg = CohortRegistry(settings, store)
    return reg, store


def completed(n: int, base: float = 1.0) -> Completed:
    return Completed(
        rewards=tuple(MemberReward(base + k, base + k, base + k, 0.0) for k in range(n)),
        metrics={"mean_individual_score": 3.0},
    )


def walk(obj: Any) -> list[Any]:
    """Every value reachable from ``obj`` through dataclass fields, mappings and sequences."""
    seen: list[Any] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        seen.append(item)
        if is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, f.name) for f in fields(item))
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "items") and callable(item.items):
            for k, v in item.items():
                stack.extend((k, v))
    return seen


def fill(reg: CohortRegistry, now: float, **kw: Any) -> Cohort:
    """Submit every slot of a cohort; returns the (now evaluating) cohort."""
    size = kw.get("size", 3)
    assert size is not None
    cohort = None
    for i in range(size):
        decision = reg.submit(sub(i, **kw), now)
        assert decision.cohort is not None, decision
        cohort = decision.cohort
    assert cohort is not None
    return cohort
