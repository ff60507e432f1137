"""The judge client over a farm of real HTTP fake judges (in-process servers on loopback):
a retry goes to another endpoint, a deadline in a farm is retried elsewhere, a hedge
lands on another endpoint, the cohort key keeps one endpoint, credentials per URL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeClient, JudgeFailedError
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from tests.judge.views import PLANET_KEYED, no_sleep


def _settings(urls: list[str], **top: object) -> Settings:
    judge = top.pop("judge", {})
    assert isinstance(judge, dict)
    return Settings(judge={"urls": urls, **judge}, **top)  # type: ignore[arg-type]


@pytest.fixture
def pair() -> Iterator[tuple[FakeJudgeServer, FakeJudgeServer]]:
    with FakeJudgeServer(FakeJudgeConfig()) as a, FakeJudgeServer(FakeJudgeConfig()) as b:
        yield a, b


async def test_an_attempt_that_got_503_is_retried_on_the_other_endpoint(
    pair: tuple[FakeJudgeServer, FakeJudgeServer],
) -> None:
    a, b = pair
    config = _settings([a.url, b.url], genrm_parse_retries=3)
    async with JudgeClient(config, sleep=no_sleep) as client:
        first = client.farm.pick(PLANET_KEYED.affinity)
        assert first is not None
        sick = a if first.url == a.url else b
        well = b if sick is a else a
        sick.set_faults(fail_503_rate=1.0)
        out = await client.judge(PLANET_KEYED)
    assert out.attempts == 2
    assert sick.stats()["total"] == 1 and well.stats()["total"] == 1


async def test_in_a_farm_a_request_timeout_is_retried_on_another_endpoint(
    pair: tuple[FakeJudgeServer, FakeJudgeServer],
) -> None:
    a, b = pair
    config = _settings([a.url, b.url], genrm_parse_retries=1, judge_request_timeout_s=0.3)
    async with JudgeClient(config, sleep=no_sleep) as client:
        first = client.farm.pick(PLANET_KEYED.affinity)
        assert first is not None
        (a if first.url == a.url else b).set_faults(hang_rate=1.0)
        out = await client.judge(PLANET_KEYED)
    assert out.attempts == 2


async def test_with_one_endpoint_a_request_timeout_still_masks_gyms_rule() -> None:
    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as only:
        config = _settings([only.url], genrm_parse_retries=3, judge_request_timeout_s=0.3)
        async with JudgeClient(config, sleep=no_sleep) as client:
            with pytest.raises(JudgeFailedError) as excinfo:
                await client.judge(PLANET_KEYED)
    assert excinfo.value.kind == "deadline"


async def test_a_hedge_goes_to_the_other_endpoint_and_the_beaten_request_counts_against_its_node(
    pair: tuple[FakeJudgeServer, FakeJudgeServer],
) -> None:
    a, b = pair
    config = _settings([a.url, b.url], judge_hedge_after_s=0.2)
    hedges: list[int] = []
    async with JudgeClient(config, on_hedge=lambda: hedges.append(1)) as client:
        first = client.farm.pick(PLANET_KEYED.affinity)
        assert first is not None
        slow = a if first.url == a.url else b
        slow.set_faults(hang_rate=1.0)
        out = await client.judge(PLANET_KEYED)
        assert hedges == [1] and out.attempts == 1
        assert first.failures == 1 and first.consecutive_failures == 1
        assert [e.hedges for e in client.farm.endpoints if e is not first] == [1]


async def test_a_cohorts_comparisons_stay_on_one_endpoint_of_an_idle_farm(
    pair: tuple[FakeJudgeServer, FakeJudgeServer],
) -> None:
    a, b = pair
    config = _settings([a.url, b.url])
    async with JudgeClient(config) as client:
        await asyncio.gather(*(client.judge(PLANET_KEYED) for _ in range(6)))
    assert sorted([a.stats()["total"], b.stats()["total"]]) == [0, 6]


async def test_each_url_sends_its_own_credentials_and_none_is_logged(
    pair: tuple[FakeJudgeServer, FakeJudgeServer], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = pair
    url_a = a.url.replace("http://", "http://alice:s3cret-a@")
    url_b = b.url.replace("http://", "http://bob:s3cret-b@")
    a.set_faults(fail_503_rate=1.0)
    b.set_faults(fail_503_rate=1.0)
    config = _settings([url_a, url_b], genrm_parse_retries=1)
    async with JudgeClient(config, sleep=no_sleep) as client:
        with pytest.raises(JudgeFailedError) as excinfo:
            await client.judge(PLANET_KEYED)
    assert a.stats()["last_authorization"].startswith("Basic ")
    assert a.stats()["last_authorization"] != b.stats()["last_authorization"]
    text = caplog.text + excinfo.value.reason
    assert "s3cret-a" not in text and "s3cret-b" not in text


def test_judge_url_and_judge_urls_together_are_a_config_error() -> None:
    with pytest.raises(ValueError, match="not both"):
        Settings(judge={"url": "http://a:8000", "urls": ["http://b:8000"]})
    with pytest.raises(ValueError, match="twice"):
        Settings(judge={"urls": ["http://b:8000", "http://b:8000"]})
    with pytest.raises(ValueError, match="at least one"):
        Settings(judge={"urls": []})
