"""genrm_reward.py under the installed OpenRLHF 0.11.2: its SingleTurnAgentExecutor loads
the file as ``--reward.remote_url`` does and calls ``reward_func`` per sample, the n
samples of a prompt concurrently; a live genrm-grpc server and the fake judge score them."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from importlib.metadata import version
from typing import Any

import openrlhf.utils.agent
import pytest
from genrm_cohort_client import CohortClient
from openrlhf.utils.agent import SingleTurnAgentExecutor

from genrm_grpc.testing.heuristic import pair_key

from .conftest import (
    GROUP_SIZE,
    REWARD_FILE,
    FakeEngine,
    Judge,
    generate_responses,
    offline_tokenizer,
)

STEP_1 = {
    "Name a prime number.": ["Seven is prime.", "Four.", "Two is the only even prime.", "Nine."],
    "What is the capital of France?": ["Paris.", "Lyon.", "The capital is Paris.", "Berlin."],
    "How many legs has a spider?": ["Eight legs.", "Six.", "A spider has eight legs.", "Ten."],
}
STEP_2 = {  # the same prompt again, a later step: new answers
    "Name a prime number.": ["Eleven.", "Two.", "Fifteen is prime.", "Thirteen is prime."],
}


def test_the_installed_openrlhf_is_the_tested_release() -> None:
    assert version("openrlhf") == "0.11.2"
    assert openrlhf.utils.agent.SingleTurnAgentExecutor is SingleTurnAgentExecutor


def loaded(executor: SingleTurnAgentExecutor) -> dict[str, Any]:
    """The globals of the genrm_reward module OpenRLHF loaded (its buffer, its clients)."""
    return executor.reward_func.__globals__


def close(executor: SingleTurnAgentExecutor) -> None:
    clients = loaded(executor)["_clients"]
    for client in clients.values():
        client.close()
    clients.clear()


def groups_of(executor: SingleTurnAgentExecutor) -> dict[str, Any]:
    (buffer,) = loaded(executor)["_buffers"].values()
    return dict(buffer._latest)


async def run_step(executor: SingleTurnAgentExecutor, answers: dict[str, list[str]]) -> dict:
    engine = FakeEngine(offline_tokenizer(), answers)
    outputs = await asyncio.gather(*(generate_responses(executor, engine, p) for p in answers))
    return dict(zip(answers, outputs, strict=True))


def reward(output: dict[str, Any]) -> float:
    assert output["reward"] is not None, "OpenRLHF got no reward (reward_func raised)"
    return float(output["reward"])


async def direct(target: str, groups: dict[str, Any]) -> dict[str, list[float]]:
    """The same groups, same slots, sent straight to SubmitMember under fresh ids."""
    async with CohortClient(target) as client:

        async def one(prompt: str, answers: list[str]) -> list[float]:
            gid = f"direct/{uuid.uuid4()}"
            results = await asyncio.gather(
                *(
                    client.submit_member(
                        {"group_id": gid, "rollout_index": i, "group_size": len(answers)},
                        prompt,
                        answer,
                        timeout=60,
                    )
                    for i, answer in enumerate(answers)
                )
            )
            return [r.reward for r in results]

        rewards = await asyncio.gather(*(one(p, g.answers) for p, g in groups.items()))
    return dict(zip(groups, rewards, strict=True))


def judged_whole_once(judge: Judge, groups: dict[str, Any]) -> None:
    stats = judge.stats()
    assert stats["total"] == GROUP_SIZE * len(groups)  # circular: n comparisons a group
    owner = {}
    for name, group in groups.items():
        for a, b in itertools.permutations(group.answers, 2):
            owner[pair_key(a, b)] = name
    per_group: dict[str, int] = {}
    for key, count in stats["pairs"].items():
        assert key in owner, "the judge compared answers of different groups"
        per_group[owner[key]] = per_group.get(owner[key], 0) + count
    assert per_group == {name: GROUP_SIZE for name in groups}


async def test_rewards_equal_a_direct_submit_member_run_and_each_group_is_judged_whole_once(
    judge: Judge, live: tuple[Judge, str]
) -> None:
    executor = SingleTurnAgentExecutor([str(REWARD_FILE)])
    try:
        outputs = await run_step(executor, STEP_1)
        groups = groups_of(executor)
        judged_whole_once(judge, groups)
        expected = await direct(live[1], groups)
    finally:
        close(executor)
    assert set(groups) == set(STEP_1)
    assert len({g.group_id for g in groups.values()}) == len(STEP_1)
    for prompt, samples in outputs.items():
        group = groups[prompt]
        assert sorted(group.answers) == sorted(STEP_1[prompt])  # each sample one slot
        by_answer = dict(zip(group.answers, expected[prompt], strict=True))
        for sample in samples:
            answer = sample["observation_tokens"]  # the response the reward belongs to
            text = offline_tokenizer().decode(answer[sample["action_ranges"][0][0] :])
            assert reward(sample) == pytest.approx(by_answer[text])
            assert sample["extra_logs"]["genrm_masked"].item() == 0.0
            assert sample["scores"] == sample["reward"]
        assert len(set(expected[prompt])) > 1  # a real group: not all one default score


async def test_a_retried_call_of_a_sample_replays_its_reward_without_a_judge_call(
    judge: Judge,
) -> None:
    executor = SingleTurnAgentExecutor([str(REWARD_FILE)])
    try:
        outputs = await run_step(executor, STEP_1)
        calls = judge.stats()["total"]
        prompt = "What is the capital of France?"
        answer = STEP_1[prompt][2]
        again = await asyncio.to_thread(executor.reward_func, [prompt + answer], [prompt], [None])
        assert judge.stats()["total"] == calls
    finally:
        close(executor)
    tokenizer = offline_tokenizer()
    (first,) = [
        s
        for s in outputs[prompt]
        if tokenizer.decode(s["observation_tokens"][s["action_ranges"][0][0] :]) == answer
    ]
    assert again["rewards"].item() == pytest.approx(reward(first))
    assert again["extra_logs"]["genrm_replayed"].item() == 1.0


async def test_a_later_step_and_a_resumed_run_judge_the_same_prompt_as_new_groups(
    judge: Judge, live: tuple[Judge, str]
) -> None:
    executor = SingleTurnAgentExecutor([str(REWARD_FILE)])
    resumed = None
    try:
        await run_step(executor, STEP_1)
        first = groups_of(executor)["Name a prime number."].group_id
        judge.reset()
        step_2 = await run_step(executor, STEP_2)
        second = groups_of(executor)["Name a prime number."]
        judged_whole_once(judge, {"p": second})
        expected = await direct(live[1], {"Name a prime number.": second})
        # A resumed run loads the file anew (new process): new nonce, same answers again.
        resumed = SingleTurnAgentExecutor([str(REWARD_FILE)])
        judge.reset()
        step_again = await run_step(resumed, STEP_2)
        third = groups_of(resumed)["Name a prime number."]
        judged_whole_once(judge, {"p": third})
    finally:
        close(executor)
        if resumed is not None:
            close(resumed)
    assert len({first, second.group_id, third.group_id}) == 3
    assert first.split("/")[1] == second.group_id.split("/")[1] != third.group_id.split("/")[1]
    got = sorted(reward(s) for s in step_2["Name a prime number."])
    assert got == pytest.approx(sorted(expected["Name a prime number."]))
    for sample in step_again["Name a prime number."]:
        assert sample["extra_logs"]["genrm_replayed"].item() == 0.0


async def test_a_judge_outage_marks_every_sample_masked_with_a_neutral_equal_reward(
    judge: Judge,
) -> None:
    judge.faults(fail_503_rate=1.0, retry_after_s=None)
    executor = SingleTurnAgentExecutor([str(REWARD_FILE)])
    try:
        outputs = await run_step(executor, {"Name a prime number.": STEP_1["Name a prime number."]})
    finally:
        close(executor)
    samples = outputs["Name a prime number."]
    assert [reward(s) for s in samples] == [0.0] * GROUP_SIZE  # equal: zero advantage
    assert [s["extra_logs"]["genrm_masked"].item() for s in samples] == [1.0] * GROUP_SIZE


async def test_missing_siblings_fail_loudly_after_the_sibling_timeout_instead_of_hanging(
    judge: Judge, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GENRM_OPENRLHF_SIBLING_TIMEOUT_S", "0.2")
    executor = SingleTurnAgentExecutor([str(REWARD_FILE)])
    try:
        with caplog.at_level(logging.ERROR, logger="genrm_reward.openrlhf"):
            # n_samples_per_prompt 2 while GENRM_OPENRLHF_GROUP_SIZE says 4
            outputs = await run_step(executor, {"Name a prime number.": ["Two.", "Three."]})
    finally:
        close(executor)
    assert [s["reward"] for s in outputs["Name a prime number."]] == [None, None]
    assert "GENRM_OPENRLHF_GROUP_SIZE equals --rollout.n_samples_per_prompt" in caplog.text
    assert judge.stats()["total"] == 0  # never a partial group


async def test_a_saturated_thread_pool_fails_every_waiting_call_at_once(
    judge: Judge, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GENRM_OPENRLHF_THREADS", "2")  # fewer threads than a group
    executor = SingleTurnAgentExecutor([str(REWARD_FILE)])
    try:
        with caplog.at_level(logging.ERROR, logger="genrm_reward.openrlhf"):
            outputs = await asyncio.wait_for(
                run_step(executor, {"Name a prime number.": STEP_1["Name a prime number."]}), 30
            )
    finally:
        close(executor)
    assert [s["reward"] for s in outputs["Name a prime number."]] == [None] * GROUP_SIZE
    assert "Raise GENRM_OPENRLHF_THREADS" in caplog.text
    assert judge.stats()["total"] == 0
