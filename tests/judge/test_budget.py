"""The adaptive output budget: the estimator alone, then the judge client against a real
HTTP fake judge whose answers converge at ~A tokens or run away to the budget."""

from __future__ import annotations

import random

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.judge.budget import AdaptiveBudget
from genrm_grpc.judge.client import JudgeClient, JudgeFailedError
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.testing.node import NodeConfig
from tests.judge.views import PLANET, no_sleep


def test_no_budget_until_enough_verdicts_then_a_margin_over_a_high_quantile() -> None:
    budget = AdaptiveBudget(cap=16384, quantile=0.99, margin=1.2, floor=1024, min_samples=64)
    rng = random.Random(1)
    for _ in range(63):
        budget.observe(rng.randint(8000, 10000))
    assert budget.current() is None and not budget.cuts()
    budget.observe(9000)
    current = budget.current()
    assert current is not None and budget.cuts()
    assert 9900 * 1.2 <= current <= 10000 * 1.2 + 1


def test_the_budget_never_exceeds_the_cap_nor_goes_below_the_floor() -> None:
    high = AdaptiveBudget(cap=4096, min_samples=1)
    high.observe(9000)
    assert high.current() == 4096 and not high.cuts()
    low = AdaptiveBudget(cap=None, floor=1024, min_samples=1)
    low.observe(10)
    assert low.current() == 1024 and low.cuts()


def test_the_budget_follows_a_judge_that_drifts() -> None:
    budget = AdaptiveBudget(cap=None, quantile=0.5, margin=1.0, min_samples=8, window=64, floor=1)
    for _ in range(64):
        budget.observe(1000)
    assert budget.current() == 1000
    for _ in range(64):
        budget.observe(3000)
    assert budget.current() == 3000


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        AdaptiveBudget(cap=1, quantile=1.0)
    with pytest.raises(ValueError):
        AdaptiveBudget(cap=1, margin=0.5)
    with pytest.raises(ValueError):
        AdaptiveBudget(cap=1, min_samples=10, window=5)


def _settings(url: str, **judge: object) -> Settings:
    return Settings(
        judge={"url": url, "api": "chat_completions", **judge},
        genrm_parse_retries=3,
        genrm_parse_retry_sleep_s=0.0,
    )


async def _judge_many(client: JudgeClient, n: int) -> tuple[int, int]:
    """Judge n comparisons; (verdicts, masked) — a comparison can run away every time."""
    verdicts = masked = 0
    for _ in range(n):
        try:
            await client.judge(PLANET)
            verdicts += 1
        except JudgeFailedError:
            masked += 1
    return verdicts, masked


async def test_adaptive_budget_learns_the_converged_length_and_cuts_runaways_there() -> None:
    # 75 % of attempts converge at 900 +- 100 tokens, 25 % run to the request's budget.
    node = NodeConfig(output_tokens="bimodal:900:budget:0.25:100")
    with FakeJudgeServer(FakeJudgeConfig(node=node, seed=5)) as fake:
        config = _settings(
            fake.url,
            max_output_tokens=16384,
            adaptive_budget=True,
            adaptive_budget_min_samples=16,
            adaptive_budget_floor=256,
        )
        async with JudgeClient(config, sleep=no_sleep) as client:
            await _judge_many(client, 30)
            budget = client.budget
            assert budget is not None and budget.cuts()
            learned = budget.current()
            assert learned is not None and 1000 <= learned <= 1000 * 1.2 + 1
            before = fake.stats()["node"]["generation_tokens"]
            wasted, cuts = client.tokens.wasted, client.tokens.adaptive_cuts
            verdicts, _ = await _judge_many(client, 40)
            wasted = client.tokens.wasted - wasted
            cuts = client.tokens.adaptive_cuts - cuts
            spent = fake.stats()["node"]["generation_tokens"] - before
    assert cuts > 0 and verdicts > 30
    # A runaway now costs the learned budget, not 16,384 (except a comparison's
    # last attempt after every earlier one was cut: that one gets the cap).
    full_cap_retries = (wasted - cuts * learned) // 16384
    assert wasted == cuts * learned + full_cap_retries * 16384
    assert spent < 40 * 1100 + cuts * learned + full_cap_retries * 16384


async def test_when_every_attempt_was_cut_the_last_retry_goes_out_with_the_cap() -> None:
    # Every attempt runs away: the adaptive budget cuts three, the fourth gets the cap.
    runaway = NodeConfig(output_tokens="bimodal:1:budget:1.0")
    with FakeJudgeServer(FakeJudgeConfig(node=runaway)) as fake:
        config = _settings(
            fake.url,
            max_output_tokens=4096,
            adaptive_budget=True,
            adaptive_budget_min_samples=1,
            adaptive_budget_floor=256,
        )
        async with JudgeClient(config, sleep=no_sleep) as client:
            assert client.budget is not None
            client.budget.observe(500)  # as if a verdict had converged at 500 tokens
            assert client.budget.current() == 600
            with pytest.raises(JudgeFailedError) as excinfo:
                await client.judge(PLANET)
            assert client.tokens.adaptive_cuts == 3
            assert client.tokens.wasted == 3 * 600 + 4096
        stats = fake.stats()
    assert stats["total"] == 4
    assert stats["last_request"]["max_tokens"] == 4096
    assert stats["node"]["generation_tokens"] == 3 * 600 + 4096
    assert (
        "max_output_tokens=600, the adaptive budget; configured cap 4096" in (excinfo.value.reason)
        or "max_output_tokens=4096" in excinfo.value.reason
    )
