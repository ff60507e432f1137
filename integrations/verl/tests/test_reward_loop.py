"""verl 0.9.1's own reward loop (RewardLoopWorker + the importlib-loaded reward manager)
scoring samples through a live genrm-grpc server and the fake judge, over real gRPC, with
the samples of every group spread over separate worker processes."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient
from transformers import AutoTokenizer

from .conftest import (
    GROUP_SIZE,
    Sample,
    judge_faults,
    judge_stats,
    run_workers,
    to_dataproto,
    verl_config,
)

GROUPS = {
    "name a prime number ?": [
        "seven is a prime number .",
        "four .",
        "two is the only even prime number .",
        "nine",
    ],
    "what is the capital of france ?": [
        "paris is the capital of france .",
        "lyon .",
        "the capital of france is paris , a city .",
        "",
    ],
    "name a city .": ["paris", "lyon is a city .", "blue", "paris is a city by a river ."],
}


def verl_samples() -> list[Sample]:
    uids = {question: str(uuid.uuid4()) for question in GROUPS}  # one per prompt, as verl
    return [
        Sample(uids[question], k, question, answer)
        for question, answers in GROUPS.items()
        for k, answer in enumerate(answers)
    ]


def spread(samples: list[Sample], workers: int) -> list[list[Sample]]:
    """Shuffle samples over workers so that every group spans more than one process."""
    rng = random.Random(21)
    while True:
        order = samples[:]
        rng.shuffle(order)
        chunks = [order[k::workers] for k in range(workers)]
        by_group: dict[str, set[int]] = {}
        for k, chunk in enumerate(chunks):
            for s in chunk:
                by_group.setdefault(s.uid, set()).add(k)
        if all(len(ks) > 1 for ks in by_group.values()):
            return chunks


async def direct_rewards(
    target: str, samples: list[Sample], texts: dict[Sample, str]
) -> dict[tuple[str, int], float]:
    """The same groups submitted straight to SubmitMember (other group ids)."""
    run = uuid.uuid4().hex
    async with CohortClient(target) as client:

        async def one(s: Sample) -> tuple[tuple[str, int], float]:
            member = pb.MemberRef(
                group_id=f"direct/{run}/{s.uid}",
                group_attempt=0,
                rollout_index=s.session_id,
                group_size=GROUP_SIZE,
            )
            prompt = pb.Prompt(messages=[pb.ChatMessage(role="user", content=s.question)])
            result = await client.submit_member(
                member, prompt, pb.Candidate(output_text=texts[s]), timeout=60
            )
            return (s.uid, s.session_id), result.reward

        return dict(await asyncio.gather(*(one(s) for s in samples)))


def flatten(chunks: list[list[Sample]], outcomes: list[Any]) -> dict[Sample, dict[str, Any]]:
    out: dict[Sample, dict[str, Any]] = {}
    for chunk, outcome in zip(chunks, outcomes, strict=True):
        assert isinstance(outcome, list), outcome
        out.update(zip(chunk, outcome, strict=True))
    return out


@pytest.fixture
def tokenizer(tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_groups_spread_over_worker_processes_get_the_rewards_of_a_direct_submit_judged_once(
    grpc_stack: tuple[str, str], tokenizer_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    judge_url, target = grpc_stack
    samples = verl_samples()
    texts = {
        s: tokenizer.decode(tokenizer.encode(s.answer), skip_special_tokens=True) for s in samples
    }
    before_direct = judge_stats(judge_url)["total"]
    direct = asyncio.run(direct_rewards(target, samples, texts))
    per_run = judge_stats(judge_url)["total"] - before_direct
    assert per_run > 0

    config = verl_config(target, tokenizer_dir)
    chunks = spread(samples, 3)
    before = judge_stats(judge_url)["total"]
    results = flatten(
        chunks, run_workers(config, [to_dataproto(c, tokenizer) for c in chunks], tmp_path)
    )

    # Every group judged whole, exactly once: the same judge calls as the direct run.
    assert judge_stats(judge_url)["total"] - before == per_run
    for s, result in results.items():
        assert result["reward_score"] == pytest.approx(direct[(s.uid, s.session_id)])
        assert result["reward_extra_info"]["score"] == result["reward_score"]
        assert result["reward_extra_info"]["genrm_masked"] == 0.0
        assert result["reward_extra_info"]["genrm_replayed"] == 0.0
    scores = [results[s]["reward_score"] for s in samples[:GROUP_SIZE]]
    assert len(set(scores)) > 1  # relative to the group, not a constant

    async def cohorts() -> list[pb.CohortInfo]:
        async with CohortClient(target) as client:
            uids = sorted({s.uid for s in samples})
            return [await client.get_cohort(f"verl/{u}", attempt=0) for u in uids]

    for info in asyncio.run(cohorts()):
        assert info.phase == pb.COHORT_PHASE_COMPLETED
        assert list(info.present_indices) == list(range(GROUP_SIZE))

    # A retried call (the same samples, another worker process) replays: same rewards,
    # no judge call.
    before_retry = judge_stats(judge_url)["total"]
    again = flatten(chunks[:1], run_workers(config, [to_dataproto(chunks[0], tokenizer)], tmp_path))
    assert judge_stats(judge_url)["total"] == before_retry
    for s, result in again.items():
        assert result["reward_score"] == results[s]["reward_score"]
        assert result["reward_extra_info"]["genrm_replayed"] == 1.0


def test_masked_group_gets_one_neutral_score_for_every_sample_and_the_masked_flag(
    grpc_stack: tuple[str, str], tokenizer_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    judge_url, target = grpc_stack
    uid = str(uuid.uuid4())
    fresh = ["green river", "red city", "blue river", "green city"]  # pairs never judged
    samples = [Sample(uid, k, "name a city .", a) for k, a in enumerate(fresh)]
    judge_faults(judge_url, fail_400_first_n=1)  # the first request of each pair: HTTP 400
    try:
        chunks = [samples[:2], samples[2:]]
        config = verl_config(target, tokenizer_dir)
        results = flatten(
            chunks, run_workers(config, [to_dataproto(c, tokenizer) for c in chunks], tmp_path)
        )
    finally:
        judge_faults(judge_url, fail_400_first_n=0)
    assert [results[s]["reward_score"] for s in samples] == [0.0] * GROUP_SIZE
    assert all(results[s]["reward_extra_info"]["genrm_masked"] == 1.0 for s in samples)


def test_siblings_that_never_arrive_fail_the_sample_loudly_with_what_to_change(
    grpc_stack: tuple[str, str], tokenizer_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    _, target = grpc_stack
    uid = str(uuid.uuid4())
    lonely = [Sample(uid, k, "name a prime number ?", a) for k, a in enumerate(["two", "nine"])]
    config = verl_config(
        target,
        tokenizer_dir,
        "+reward.reward_kwargs.genrm_sibling_timeout_s=1",
        "+reward.reward_kwargs.genrm_poll_s=0.2",
    )
    [outcome] = run_workers(config, [to_dataproto(lonely, tokenizer)], tmp_path)
    kind, name, message = outcome
    assert (kind, name) == ("error", "SiblingsStalledError")
    assert f"holds 2 of {GROUP_SIZE} samples of group verl/{uid}" in message
    assert "genrm_sibling_timeout_s" in message and "reward.num_workers" in message


def test_a_sample_without_session_id_is_refused_naming_the_v1_trainer(
    grpc_stack: tuple[str, str], tokenizer_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    _, target = grpc_stack
    data = to_dataproto([Sample(str(uuid.uuid4()), 0, "name a city .", "paris")], tokenizer)
    del data.non_tensor_batch["session_id"]  # what verl's legacy trainer hands over
    [outcome] = run_workers(verl_config(target, tokenizer_dir), [data], tmp_path)
    assert outcome[:2] == ("error", "ValueError")
    assert "trainer.use_v1=True" in outcome[2]


def test_validation_with_another_group_size_is_refused_when_the_worker_starts(
    grpc_stack: tuple[str, str], tokenizer_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    _, target = grpc_stack
    config = verl_config(target, tokenizer_dir, "actor_rollout_ref.rollout.val_kwargs.n=1")
    data = to_dataproto([Sample(str(uuid.uuid4()), 0, "name a city .", "paris")], tokenizer)
    [outcome] = run_workers(config, [data], tmp_path)
    assert outcome[:2] == ("error", "ValueError")
    assert "actor_rollout_ref.rollout.val_kwargs.n=4" in outcome[2]
