"""Verdict reuse across attempts of one group, over real gRPC and the HTTP fake judge.

A pass of attempt k + 1 that asks the judge the byte-identical question as a pass
journaled for an earlier attempt of the same group (same prompt, answers in the same
order, same judge settings and side swap) takes that verdict instead of a judge call.
Legacy cohorts (no group_id) never reuse; ``verdict_reuse: off`` turns it off.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_grpc.testing import FakeJudgeServer
from tests.server.conftest import StartServer

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
SIZE = 4  # circular: 4 passes


def _ref(group: str | None, k: int, attempt: int = 0) -> pb.MemberRef:
    ref = pb.MemberRef(rollout_index=k, group_size=SIZE)
    if group is None:
        ref.task_index = 3
    else:
        ref.group_id, ref.group_attempt = group, attempt
    return ref


def _answer(k: int, variant: str = "") -> pb.Candidate:
    return pb.Candidate(output_text=f"answer {k}{variant}: {3 + 4 * k}")


async def _group(
    client: object, group: str | None, attempt: int, variant: str = ""
) -> list[pb.MemberResult]:
    return list(
        await asyncio.gather(
            *(
                client.submit_member(
                    _ref(group, k, attempt), PROMPT, _answer(k, variant), timeout=30
                )  # type: ignore[attr-defined]
                for k in range(SIZE)
            )
        )
    )


@pytest.mark.parametrize("store", [None, "memory://"], ids=["sqlite", "memory"])
async def test_a_masked_attempt_resent_with_the_same_answers_reuses_every_finished_pass(
    start_server: StartServer, fake_judge: FakeJudgeServer, store: str | None
) -> None:
    """The usual retry: the judge fails one pass for good, attempt 0 is masked; attempt 1
    sends the same answers and only the failed pass is judged again."""
    server, client = await start_server(
        genrm_parse_retries=0, judge_max_concurrency=1, **({"store": store} if store else {})
    )
    # One request at a time, each answered after 400 ms; the fault is switched on while
    # the 3rd is being answered (its fate is decided on arrival), so the 4th request
    # fails with a non-retryable 400 after passes 1-3 were journaled.
    fake_judge.set_faults(latency_ms="400")
    fake_judge.reset_stats()
    results: list[pb.MemberResult] = []

    async def attempt0() -> None:
        results.extend(await _group(client, "m", 0))

    task = asyncio.ensure_future(attempt0())
    assert await asyncio.to_thread(fake_judge.wait_for_requests, 3, 30)
    fake_judge.set_faults(fail_400_rate=1.0)
    await task
    assert all(r.mask_sample for r in results)
    fake_judge.set_faults(fail_400_rate=0.0, latency_ms="0")
    journaled = fake_judge.stats()["total"] - 1  # the failed request has no verdict

    before = fake_judge.stats()["total"]
    again = await _group(client, "m", 1)
    assert not any(r.mask_sample for r in again)
    assert fake_judge.stats()["total"] - before == SIZE - journaled
    assert {r.judge_passes_reused for r in again} == {journaled}
    info = await client.get_cohort(_ref("m", 0, 1), prompt=PROMPT)  # type: ignore[attr-defined]
    assert info.judge_passes_reused == journaled
    assert server.runtime.stats()["passes_reused"] == journaled
    exposition = server.metrics.exposition().decode()
    assert f"genrm_judge_passes_reused_total {float(journaled)}" in exposition


@pytest.mark.stores("sqlite")
async def test_identical_answers_in_a_new_attempt_need_no_judge_call_on_the_file_store(
    start_server: StartServer, fake_judge: FakeJudgeServer
) -> None:
    _, client = await start_server()
    first = await _group(client, "same", 0)
    calls = fake_judge.stats()["total"]
    assert calls == SIZE
    second = await _group(client, "same", 1)
    assert fake_judge.stats()["total"] == calls
    assert [r.reward for r in second] == [r.reward for r in first]
    assert {r.judge_passes_reused for r in second} == {SIZE}
    # A different answer in one slot: only the passes it takes part in are judged.
    changed = list(
        await asyncio.gather(
            *(
                client.submit_member(
                    _ref("same", k, 2), PROMPT, _answer(k, "!" if k == 0 else ""), timeout=30
                )
                for k in range(SIZE)
            )
        )
    )
    assert fake_judge.stats()["total"] == calls + 2  # circular: slot 0 is in two passes
    assert {r.judge_passes_reused for r in changed} == {SIZE - 2}


async def test_legacy_reruns_and_reuse_off_are_judged_again(
    start_server: StartServer, fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    _, client = await start_server(verdict_reuse="off")
    await _group(client, "off", 0)
    await _group(client, "off", 1)
    assert fake_judge.stats()["total"] == 2 * SIZE

    fake_judge.reset_stats()
    _, legacy_client = await start_server(store=f"sqlite:///{tmp_path}/legacy.sqlite3")
    await _group(legacy_client, None, 0)
    await _group(legacy_client, None, 0)  # the same legacy key again after success
    assert fake_judge.stats()["total"] == 2 * SIZE  # judged again, as NeMo Gym does
