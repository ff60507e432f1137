"""The judge client against the fake judge over real loopback HTTP.

Backoff waits are recorded by an injected ``sleep`` instead of being slept, so the
tests neither wait nor depend on timing (except the deadline test, which needs a
real clock and keeps it short).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest

from genrm_grpc.config import Settings
from genrm_grpc.judge.client import (
    MAX_REASON_CHARS,
    JudgeClient,
    JudgeFailedError,
    JudgeInput,
    JudgeOutcome,
    TokenUsage,
    parse_retry_after,
)
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer, fake_verdict, pair_key
from tests.judge.views import judge_settings

PROMPT = "Name the largest planet in the solar system."
ANSWER_A = "Jupiter is the largest planet in the solar system, more massive than all others."
ANSWER_B = "Saturn."
INPUT = JudgeInput(
    messages=(("system", "Be concise."), ("user", PROMPT)),
    response_1=ANSWER_A,
    response_2=ANSWER_B,
    principle=None,
)
DEFAULT_VERDICT = Verdict(3.0, 3.0, 3.5, parse_failed=True)


def expected_verdict(response_1: str, response_2: str) -> Verdict:
    score_1, score_2, ranking = fake_verdict(PROMPT, response_1, response_2)
    return Verdict(float(score_1), float(score_2), float(ranking))


class SleepRecorder:
    """Records backoff waits instead of sleeping; can run a hook on each wait."""

    def __init__(self, on_sleep: Callable[[int], None] | None = None) -> None:
        self.waits: list[float] = []
        self._on_sleep = on_sleep

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self._on_sleep is not None:
            self._on_sleep(len(self.waits))


@pytest.fixture
def fake() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer() as server:
        yield server


def config_for(server: FakeJudgeServer, **overrides: Any) -> Settings:
    keys: dict[str, Any] = {
        "url": server.url,
        "api": "responses",
        "model": "genrm",
        "judge_request_timeout_s": 10.0,
        "genrm_parse_retries": 3,
        "genrm_parse_retry_sleep_s": 0.1,
        "max_retry_sleep_s": 1.0,
        **overrides,
    }
    return judge_settings(keys.pop("url"), **keys)


async def judge_once(
    server: FakeJudgeServer,
    *,
    sleep: SleepRecorder | None = None,
    random: Callable[[], float] = lambda: 0.5,
    inp: JudgeInput = INPUT,
    swap: bool = False,
    **overrides: Any,
) -> JudgeOutcome:
    async with JudgeClient(
        config_for(server, **overrides), sleep=sleep or SleepRecorder(), random=random
    ) as client:
        return await client.judge(inp, swap=swap)


async def expect_failure(server: FakeJudgeServer, **kwargs: Any) -> JudgeFailedError:
    with pytest.raises(JudgeFailedError) as excinfo:
        await judge_once(server, **kwargs)
    return excinfo.value


# -- wire formats -----------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_both_wire_formats_return_the_judges_parsed_verdict(
    fake: FakeJudgeServer, api: str
) -> None:
    outcome = await judge_once(fake, api=api)

    assert outcome.verdict == expected_verdict(ANSWER_A, ANSWER_B)
    assert outcome.attempts == 1
    stats = fake.stats()
    assert stats["by_endpoint"] == {api: 1}
    assert stats["last_request"]["model"] == "genrm"


async def test_responses_format_sends_conversation_as_input_and_answers_as_metadata(
    fake: FakeJudgeServer,
) -> None:
    await judge_once(
        fake, inp=replace(INPUT, principle="Prefer correct answers."), max_output_tokens=64
    )

    last = fake.stats()["last_request"]
    assert last["endpoint"] == "responses"
    assert last["roles"] == ["system", "user"]
    assert last["principle"] == "Prefer correct answers."
    assert last["max_tokens"] == 64


async def test_chat_format_appends_principle_then_response_roles(fake: FakeJudgeServer) -> None:
    await judge_once(
        fake,
        api="chat_completions",
        inp=replace(INPUT, principle="Prefer correct answers."),
        max_output_tokens=64,
    )

    last = fake.stats()["last_request"]
    assert last["roles"] == ["system", "user", "principle", "response_1", "response_2"]
    assert last["max_tokens"] == 64


async def test_chat_format_omits_the_principle_role_when_there_is_none(
    fake: FakeJudgeServer,
) -> None:
    await judge_once(fake, api="chat_completions")

    assert fake.stats()["last_request"]["roles"] == ["system", "user", "response_1", "response_2"]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_base_url_may_carry_a_v1_suffix(fake: FakeJudgeServer, suffix: str) -> None:
    outcome = await judge_once(fake, url=fake.url + suffix)

    assert outcome.attempts == 1
    assert fake.stats()["total"] == 1


async def test_swap_sends_answers_in_swapped_order_and_maps_the_verdict_back(
    fake: FakeJudgeServer,
) -> None:
    outcome = await judge_once(fake, swap=True)

    seen_by_judge = expected_verdict(ANSWER_B, ANSWER_A)
    assert outcome.verdict == Verdict(
        seen_by_judge.score_2, seen_by_judge.score_1, 7.0 - seen_by_judge.ranking
    )
    assert fake.stats()["pairs"] == {pair_key(ANSWER_B, ANSWER_A): 1}


async def test_authorization_header_is_sent_only_when_an_api_key_is_set(
    fake: FakeJudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_TEST_API_KEY", "sk-test-123")
    await judge_once(fake, api_key_env="JUDGE_TEST_API_KEY")
    assert fake.stats()["last_authorization"] == "Bearer sk-test-123"

    await judge_once(fake)
    assert fake.stats()["last_authorization"] is None


# -- retries ------------------------------------------------------------------------------


async def test_http_503_is_retried_and_the_next_answer_is_used() -> None:
    sleep = SleepRecorder()
    with FakeJudgeServer(FakeJudgeConfig(fail_503_first_n=1)) as fake:
        outcome = await judge_once(fake, sleep=sleep)
        stats = fake.stats()

    assert outcome.verdict == expected_verdict(ANSWER_A, ANSWER_B)
    assert outcome.attempts == 2
    assert stats["by_outcome"] == {"fail_503": 1, "ok": 1}
    assert len(sleep.waits) == 1


async def test_retry_after_on_429_sets_a_floor_under_the_backoff_wait() -> None:
    sleep = SleepRecorder()
    config = FakeJudgeConfig(fail_429_first_n=2, retry_after_s=4)
    with FakeJudgeServer(config) as fake:
        outcome = await judge_once(
            fake,
            sleep=sleep,
            random=lambda: 0.0,
            genrm_parse_retry_sleep_s=0.01,
            max_retry_sleep_s=10.0,
        )

    assert outcome.attempts == 3
    assert sleep.waits == [4.0, 4.0]


async def test_retry_after_is_capped_at_the_maximum_backoff() -> None:
    sleep = SleepRecorder()
    config = FakeJudgeConfig(fail_429_first_n=1, retry_after_s=120)
    with FakeJudgeServer(config) as fake:
        await judge_once(fake, sleep=sleep, random=lambda: 0.0, max_retry_sleep_s=2.5)

    assert sleep.waits == [2.5]


async def test_backoff_doubles_from_the_first_sleep_up_to_the_cap() -> None:
    sleep = SleepRecorder()
    with FakeJudgeServer(FakeJudgeConfig(malformed_rate=1.0)) as fake:
        await judge_once(
            fake,
            sleep=sleep,
            random=lambda: 1.0,
            genrm_parse_retries=5,
            genrm_parse_retry_sleep_s=0.1,
            max_retry_sleep_s=0.5,
        )

    assert sleep.waits == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])


async def test_backoff_jitter_scales_each_wait_below_its_ceiling() -> None:
    draws = iter([0.25, 0.5, 0.75])
    sleep = SleepRecorder()
    with FakeJudgeServer(FakeJudgeConfig(fail_503_rate=1.0)) as fake:
        await expect_failure(
            fake,
            sleep=sleep,
            random=lambda: next(draws),
            genrm_parse_retry_sleep_s=1.0,
            max_retry_sleep_s=60,
        )

    assert sleep.waits == pytest.approx([0.25 * 1.0, 0.5 * 2.0, 0.75 * 4.0])


@pytest.mark.parametrize("fault", ["reset", "truncate", "invalid_json", "empty", "budget_exhaust"])
async def test_interrupted_or_unusable_answers_are_retried(fault: str) -> None:
    sleep = SleepRecorder()
    first_n: dict[str, Any] = {f"{fault}_first_n": 1}
    with FakeJudgeServer(FakeJudgeConfig(**first_n)) as fake:
        outcome = await judge_once(fake, sleep=sleep)
        stats = fake.stats()

    assert outcome.verdict == expected_verdict(ANSWER_A, ANSWER_B)
    assert outcome.attempts == 2
    assert stats["by_outcome"] == {fault: 1, "ok": 1}
    assert len(sleep.waits) == 1


async def test_one_retry_budget_is_shared_by_different_failure_kinds() -> None:
    config = FakeJudgeConfig(reset_first_n=1, fail_503_first_n=2, malformed_first_n=3)
    with FakeJudgeServer(config) as fake:
        outcome = await judge_once(fake, genrm_parse_retries=3)
        stats = fake.stats()

    assert outcome.attempts == 4
    assert outcome.verdict == expected_verdict(ANSWER_A, ANSWER_B)
    assert stats["by_outcome"] == {"reset": 1, "fail_503": 1, "malformed": 1, "ok": 1}


def _warnings_from_client(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if record.name == "genrm_grpc.judge.client" and record.levelno == logging.WARNING
    ]


async def test_each_retried_attempt_logs_one_structured_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="genrm_grpc.judge.client")
    with FakeJudgeServer(FakeJudgeConfig(fail_503_first_n=2)) as fake:
        await judge_once(fake)

    records = _warnings_from_client(caplog)
    assert [getattr(r, "judge_attempt", None) for r in records] == [1, 2]
    assert all(getattr(r, "judge_failure_kind", None) == "http_503" for r in records)
    assert all(getattr(r, "judge_max_attempts", None) == 4 for r in records)


# -- giving up ---------------------------------------------------------------------------


async def test_malformed_answers_exhaust_the_budget_then_fall_back_to_the_default_verdict() -> None:
    with FakeJudgeServer(FakeJudgeConfig(malformed_rate=1.0)) as fake:
        outcome = await judge_once(fake, genrm_parse_retries=3)
        stats = fake.stats()

    assert outcome.verdict == DEFAULT_VERDICT
    assert outcome.attempts == 4
    assert stats["total"] == 4
    assert stats["pairs"] == {pair_key(ANSWER_A, ANSWER_B): 4}


async def test_default_verdict_uses_the_configured_defaults() -> None:
    with FakeJudgeServer(FakeJudgeConfig(malformed_rate=1.0)) as fake:
        outcome = await judge_once(
            fake, genrm_parse_retries=0, default_score=2.0, default_ranking=4.0
        )

    assert outcome.verdict == Verdict(2.0, 2.0, 4.0, parse_failed=True)
    assert outcome.attempts == 1


async def test_budget_exhaustion_then_a_malformed_last_answer_still_falls_back() -> None:
    config = FakeJudgeConfig(budget_exhaust_first_n=2, malformed_rate=1.0)
    with FakeJudgeServer(config) as fake:
        outcome = await judge_once(fake, genrm_parse_retries=2)

    assert outcome.verdict == DEFAULT_VERDICT
    assert outcome.attempts == 3


async def test_malformed_then_budget_exhausted_twice_falls_back_like_the_reverse_order() -> None:
    # The case: the completed-but-unparseable answer came first. The outcome
    # must not depend on what followed it.
    config = FakeJudgeConfig(malformed_first_n=1, budget_exhaust_rate=1.0)
    with FakeJudgeServer(config) as fake:
        outcome = await judge_once(fake, genrm_parse_retries=2)
        stats = fake.stats()

    assert stats["by_outcome"] == {"malformed": 1, "budget_exhaust": 2}
    assert outcome.verdict == DEFAULT_VERDICT
    assert outcome.attempts == 3


async def test_an_empty_last_answer_after_a_malformed_one_still_falls_back() -> None:
    config = FakeJudgeConfig(malformed_first_n=1, empty_rate=1.0)
    with FakeJudgeServer(config) as fake:
        outcome = await judge_once(fake, genrm_parse_retries=1)
        stats = fake.stats()

    assert stats["by_outcome"] == {"malformed": 1, "empty": 1}
    assert outcome.verdict == DEFAULT_VERDICT


async def test_an_incomplete_last_answer_after_malformed_ones_falls_back() -> None:
    with FakeJudgeServer(FakeJudgeConfig(malformed_rate=1.0)) as fake:

        def before_last_attempt(waits_so_far: int) -> None:
            if waits_so_far == 3:
                fake.set_faults(malformed_rate=0.0, budget_exhaust_rate=1.0)

        outcome = await judge_once(fake, sleep=SleepRecorder(before_last_attempt))
        stats = fake.stats()

    assert stats["by_outcome"] == {"malformed": 3, "budget_exhaust": 1}
    assert outcome.verdict == DEFAULT_VERDICT


async def test_transport_and_http_failures_around_no_completed_answer_are_masked() -> None:
    config = FakeJudgeConfig(reset_first_n=1, fail_503_first_n=2, budget_exhaust_rate=1.0)
    with FakeJudgeServer(config) as fake:
        error = await expect_failure(fake, genrm_parse_retries=3, max_output_tokens=300)
        stats = fake.stats()

    assert stats["by_outcome"] == {"reset": 1, "fail_503": 1, "budget_exhaust": 2}
    assert "2 of 4 attempt(s) ended incomplete" in error.reason
    assert "max_output_tokens=300" in error.reason


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
@pytest.mark.parametrize(("budget", "label"), [(512, "512"), (None, "unset")])
async def test_budget_exhaustion_on_every_attempt_fails_naming_the_output_budget(
    api: str, budget: int | None, label: str
) -> None:
    with FakeJudgeServer(FakeJudgeConfig(budget_exhaust_rate=1.0)) as fake:
        error = await expect_failure(fake, api=api, max_output_tokens=budget)
        total = fake.stats()["total"]

    assert total == 4
    assert "4 of 4 attempt(s) ended incomplete" in error.reason
    assert f"max_output_tokens={label}" in error.reason
    assert "raise the judge output budget" in error.reason
    assert "constrain the judge's reasoning" in error.reason
    assert len(error.reason) <= MAX_REASON_CHARS


async def test_persistent_503_exhausts_the_budget_and_fails_with_the_last_status() -> None:
    sleep = SleepRecorder()
    with FakeJudgeServer(FakeJudgeConfig(fail_503_rate=1.0)) as fake:
        error = await expect_failure(fake, sleep=sleep)
        total = fake.stats()["total"]

    assert total == 4
    assert len(sleep.waits) == 3
    assert "after 4 attempt(s)" in error.reason
    assert "HTTP 503" in error.reason
    assert "max_output_tokens" not in error.reason


async def test_empty_last_answer_is_a_judge_failure_not_a_default_verdict() -> None:
    with FakeJudgeServer(FakeJudgeConfig(empty_rate=1.0)) as fake:
        error = await expect_failure(fake, genrm_parse_retries=1)

    assert "completed answer is empty" in error.reason


@pytest.mark.parametrize(
    ("faults", "status"),
    [(FakeJudgeConfig(fail_400_rate=1.0), 400), (FakeJudgeConfig(model="other-model"), 404)],
)
async def test_non_retryable_http_errors_fail_at_once_after_one_request(
    faults: FakeJudgeConfig, status: int
) -> None:
    sleep = SleepRecorder()
    with FakeJudgeServer(faults) as fake:
        error = await expect_failure(fake, sleep=sleep)
        total = fake.stats()["total"]

    assert total == 1
    assert sleep.waits == []
    assert f"HTTP {status}" in error.reason
    assert "not retried" in error.reason


async def test_hung_judge_hits_the_request_deadline_and_fails_promptly() -> None:
    sleep = SleepRecorder()
    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as fake:
        started = time.monotonic()
        error = await expect_failure(fake, sleep=sleep, judge_request_timeout_s=0.3)
        elapsed = time.monotonic() - started
        total = fake.stats()["total"]

    assert elapsed < 3.0
    assert total == 1
    assert sleep.waits == []
    assert "judge_request_timeout_s=0.3s" in error.reason


async def test_deadline_after_budget_exhaustion_still_reports_the_output_budget() -> None:
    with FakeJudgeServer(FakeJudgeConfig(budget_exhaust_first_n=1)) as fake:

        def then_hang(waits_so_far: int) -> None:
            fake.set_faults(hang_rate=1.0)

        error = await expect_failure(
            fake, sleep=SleepRecorder(then_hang), judge_request_timeout_s=0.3, max_output_tokens=128
        )

    assert "deadline expired" in error.reason
    assert "on attempt 2 of 4" in error.reason
    assert "1 of 2 attempt(s) ended incomplete" in error.reason
    assert "max_output_tokens=128" in error.reason


async def test_unreachable_judge_is_a_judge_failure_after_the_budget() -> None:
    with FakeJudgeServer() as fake:
        url = fake.url  # the port is free again once the fake stops
    config = judge_settings(url, api="responses", model="genrm", genrm_parse_retries=1)
    async with JudgeClient(config, connect_retries=0, sleep=SleepRecorder()) as client:
        with pytest.raises(JudgeFailedError) as excinfo:
            await client.judge(INPUT)

    assert "cannot connect (ClientConnectorError: Connection refused)" in excinfo.value.reason
    assert "after 2 attempt(s)" in excinfo.value.reason
    assert url.rsplit(":", 1)[1] not in excinfo.value.reason  # no internal address


# -- accounting and cancellation --------------------------------------------------------


async def test_usage_is_summed_over_every_attempt_of_a_comparison() -> None:
    with FakeJudgeServer(FakeJudgeConfig(malformed_rate=1.0)) as fake:
        single = await judge_once(fake, genrm_parse_retries=0)
        triple = await judge_once(fake, genrm_parse_retries=2)

    assert single.usage is not None
    assert single.usage.input_tokens > 0
    assert single.usage.reasoning_tokens > 0
    # Cached prompt tokens differ: the fake judge's prefix cache is warm by then.
    assert triple.usage == TokenUsage(
        3 * single.usage.input_tokens,
        3 * single.usage.output_tokens,
        3 * single.usage.reasoning_tokens,
        triple.usage.cached_tokens,
        3 * single.usage.wasted_output_tokens,
    )
    assert triple.usage.cached_tokens > 0


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_usage_is_read_from_both_wire_formats(fake: FakeJudgeServer, api: str) -> None:
    outcome = await judge_once(fake, api=api)

    assert outcome.usage is not None
    assert outcome.usage.input_tokens > 0
    assert outcome.usage.output_tokens > outcome.usage.reasoning_tokens > 0


async def test_cancelling_a_comparison_propagates_and_is_not_retried() -> None:
    sleep = SleepRecorder()
    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as fake:
        async with JudgeClient(config_for(fake), sleep=sleep) as client:
            task = asyncio.create_task(client.judge(INPUT))
            arrived = await asyncio.to_thread(fake.wait_for_requests, 1, 10.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        total = fake.stats()["total"]

    assert arrived
    assert total == 1
    assert sleep.waits == []


# -- small pieces ---------------------------------------------------------------------------


def test_retry_after_accepts_delay_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    in_ninety = format_datetime(datetime(2026, 1, 1, 12, 1, 30, tzinfo=UTC), usegmt=True)

    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after(in_ninety, now=now.timestamp()) == pytest.approx(90.0)
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now.timestamp()) == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after("-4") == 0.0


def test_failure_reasons_are_truncated_to_the_protocol_limit() -> None:
    error = JudgeFailedError("x" * 5000)

    assert len(error.reason) == MAX_REASON_CHARS
    assert str(error) == error.reason


@pytest.mark.parametrize(
    "bad",
    [
        {"judge": {"url": "127.0.0.1:8000"}},
        {"judge_request_timeout_s": 0.0},
        {"judge_request_timeout_s": float("inf")},
        {"genrm_parse_retries": -1},
        {"genrm_parse_retry_sleep_s": float("nan")},
        {"judge": {"max_connections": 0}},
        {"judge": {"max_output_tokens": 0}},
    ],
)
def test_config_rejects_invalid_settings(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Settings(**bad)


def test_a_negative_connect_retry_count_is_refused() -> None:
    with pytest.raises(ValueError, match="connect_retries"):
        JudgeClient(judge_settings("http://127.0.0.1:8000"), connect_retries=-1)


# -- logging ----------------------------------------------------------------------------


async def test_successful_judge_calls_log_nothing_at_info_and_one_debug_line_per_request(
    fake: FakeJudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # every logger, the HTTP library's included
    async with JudgeClient(config_for(fake), sleep=SleepRecorder()) as client:
        for _ in range(5):
            await client.judge(INPUT)
    assert [r.getMessage() for r in caplog.records] == []

    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="genrm_grpc.judge.client")
    async with JudgeClient(config_for(fake), sleep=SleepRecorder()) as client:
        for _ in range(3):
            await client.judge(INPUT)
    requests = [r for r in caplog.records if getattr(r, "judge_outcome", None) == "ok"]
    assert len(requests) == 3
    assert all(r.levelno == logging.DEBUG for r in requests)
