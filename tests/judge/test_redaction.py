"""A password in the judge URL never leaves the process: not in reasons, errors or logs."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Iterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError

from genrm_grpc.config import ConfigError, load_settings
from genrm_grpc.judge.client import JudgeClient, JudgeFailedError, JudgeInput
from genrm_grpc.judge.redact import Redactor, redact_url, split_userinfo
from tests.judge.processes import FakeJudgeProcess, ServerProcess, free_port
from tests.judge.views import judge_settings

SECRET = "s3cr3t-Pa55"
INPUT = JudgeInput(
    messages=(("user", "Name the largest planet."),),
    response_1="Jupiter is the largest planet.",
    response_2="Mars.",
)


def test_redact_url_replaces_user_info_only() -> None:
    assert redact_url(f"http://bob:{SECRET}@judge:8000/v1") == "http://***@judge:8000/v1"
    assert redact_url("http://judge:8000") == "http://judge:8000"


def test_split_userinfo_decodes_percent_escapes() -> None:
    assert split_userinfo("https://bob:p%40ss@judge/v1") == ("https://judge/v1", "bob", "p@ss")
    assert split_userinfo("https://judge/v1") == ("https://judge/v1", None, None)


def test_redactor_removes_raw_and_decoded_secrets_from_any_text() -> None:
    redact = Redactor("http://bob:p%40ssw0rd@judge:8000")

    assert (
        redact("failed: http://bob:p%40ssw0rd@judge:8000/v1") == "failed: http://***@judge:8000/v1"
    )
    assert redact("auth p@ssw0rd refused") == "auth *** refused"
    assert redact("bob says hello") == "bob says hello"


@pytest.fixture
def failing_judge() -> Iterator[FakeJudgeProcess]:
    with FakeJudgeProcess(None, "--fail-503-rate", "1") as process:
        yield process


async def test_user_info_is_sent_as_basic_auth_and_never_in_reasons_or_logs(
    failing_judge: FakeJudgeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = failing_judge.url.replace("http://", f"http://bob:{SECRET}@")
    config = judge_settings(url, api="responses", model="genrm", genrm_parse_retries=2)

    async def no_sleep(_seconds: float) -> None:
        return None

    async with JudgeClient(config, sleep=no_sleep) as client:
        with pytest.raises(JudgeFailedError) as excinfo:
            await client.judge(INPUT)

    expected = "Basic " + base64.b64encode(f"bob:{SECRET}".encode()).decode()
    assert failing_judge.stats()["last_authorization"] == expected
    reason = excinfo.value.reason
    assert "HTTP 503" in reason
    assert SECRET not in reason
    assert str(failing_judge.port) not in reason  # no internal address either
    logged = [r.getMessage() + repr(vars(r)) for r in caplog.records]
    assert len(logged) >= 2
    assert not [line for line in logged if SECRET in line]


async def test_an_unreachable_judge_with_a_password_leaks_it_nowhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://bob:{SECRET}@127.0.0.1:{free_port()}"
    config = judge_settings(url, api="chat_completions", model="genrm", genrm_parse_retries=1)

    async def no_sleep(_seconds: float) -> None:
        return None

    async with JudgeClient(config, connect_retries=0, sleep=no_sleep) as client:
        with pytest.raises(JudgeFailedError) as excinfo:
            await client.judge(INPUT)
        probe = await client.probe(2.0)

    assert "cannot connect" in excinfo.value.reason
    assert SECRET not in excinfo.value.reason
    assert not probe.reachable and SECRET not in probe.detail
    assert not [r for r in caplog.records if SECRET in r.getMessage() + repr(vars(r))]


def test_config_errors_do_not_echo_the_password() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_settings(judge={"url": f"ftp://bob:{SECRET}@judge"}, strict_env=False)
    assert SECRET not in str(excinfo.value)


# -- end to end: server and fake judge processes ------------------------------------------


async def _masked_group_and_compare(target: str) -> tuple[list[str], CohortError]:
    prompt = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime.")])
    answers = ["Seven.", "Four."]
    async with CohortClient(target) as client:
        requests = [
            pb.SubmitMemberRequest(
                member=pb.MemberRef(
                    group_id="leak", group_attempt=0, rollout_index=k, group_size=2
                ),
                prompt=prompt,
                candidate=pb.Candidate(output_text=a),
            )
            for k, a in enumerate(answers)
        ]
        events = [e async for e in client.stream_groups(requests, timeout=60)]
        reasons = [e.result.failure_reason for e in events if e.WhichOneof("event") == "result"]
        try:
            await client.compare(prompt, [pb.Candidate(output_text=a) for a in answers], timeout=60)
        except CohortError as exc:
            return reasons, exc
    raise AssertionError("Compare succeeded against a judge that only answers 503")


@pytest.mark.e2e
def test_the_judge_password_appears_in_no_failure_reason_compare_error_or_log_line(
    failing_judge: FakeJudgeProcess,
) -> None:
    url = failing_judge.url.replace("http://", f"http://bob:{SECRET}@")
    env = {
        "GENRM_JUDGE__URL": url,
        "GENRM_GENRM_PARSE_RETRIES": "1",
        "GENRM_GENRM_PARSE_RETRY_SLEEP_S": "0.01",
        "GENRM_LOG_LEVEL": "DEBUG",
    }
    with ServerProcess(env) as server:
        reasons, error = asyncio.run(_masked_group_and_compare(server.target))
        server.stop()
        lines = server.log_lines()

    assert len(reasons) == 2 and all("HTTP 503" in r for r in reasons)
    assert not [r for r in reasons if SECRET in r or str(failing_judge.port) in r]
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert error.reason == "JUDGE_FAILED"
    assert "HTTP 503" in error.message
    assert SECRET not in str(error) and SECRET not in repr(error.metadata)
    assert str(failing_judge.port) not in error.message
    assert any("***@127.0.0.1" in line for line in lines)  # the start-up judge line
    assert not [line for line in lines if SECRET in line]


def test_an_invalid_judge_url_is_one_config_line_without_the_password() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_settings(judge={"url": f"ftp://bob:{SECRET}@judge:8000"})
    message = str(excinfo.value)
    assert "judge.url" in message and "http://" in message
    assert SECRET not in message and "\n" not in message
