"""The Prometheus endpoint: scraped over real HTTP while real groups go through the server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from genrm_grpc.config import load_settings
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
ANSWERS = ["Seven is prime.", "Four.", "Two is the only even prime.", ""]


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


@pytest.fixture
async def server(fake_judge: FakeJudgeServer) -> AsyncIterator[CohortServer]:
    settings = load_settings(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        judge={"url": fake_judge.url},
        genrm_parse_retry_sleep_s=0.01,
        judge_max_concurrency=1,
        shutdown_grace_s=0.1,
    )
    running = CohortServer(settings)
    await running.start()
    yield running
    await running.stop()


def _request(
    group: str, k: int, *, size: int = 4, text: str | None = None
) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(group_id=group, group_attempt=0, rollout_index=k, group_size=size),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=ANSWERS[k % len(ANSWERS)] if text is None else text),
    )


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples[(name, tuple(sorted(labels.items())))]


async def _scrape(server: CohortServer, path: str = "/metrics") -> Scrape:
    async with httpx.AsyncClient() as http:
        reply = await http.get(f"http://127.0.0.1:{server.metrics_port}{path}", timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain; version=")
    return Scrape(reply.text)


async def _accepted(call: Any, n: int) -> None:
    """Read a StreamGroups call until ``n`` members were accepted (the server holds them)."""
    seen = 0
    while seen < n:
        event = await call.read()
        assert event.WhichOneof("event") == "accepted", event
        seen += 1


async def test_metrics_are_scraped_over_http_and_follow_the_groups(
    server: CohortServer, fake_judge: FakeJudgeServer
) -> None:
    assert server.metrics_port not in (None, 0, server.port)
    fake_judge.set_faults(fail_503_first_n=1)  # every pair fails once, then succeeds
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = pb_grpc.CohortServiceStub(channel)
        results = await asyncio.gather(
            *(cohorts.SubmitMember(_request("done", k), timeout=30) for k in range(4))
        )
        assert not any(r.result.mask_sample for r in results)
        replay = await cohorts.SubmitMember(_request("done", 2), timeout=10)
        assert replay.result.replayed
        with pytest.raises(grpc.RpcError):
            await cohorts.SubmitMember(_request("done", 1, text="changed"), timeout=10)
        with pytest.raises(grpc.RpcError):
            await cohorts.SubmitMember(_request("bad", 9), timeout=10)  # index ≥ size

        # A collecting cohort, and an evaluating one whose judge hangs: the one judge
        # permit is held by its first pair and the other two pairs queue for it.
        fake_judge.set_faults(fail_503_first_n=0, hang_rate=1.0)
        collecting = cohorts.StreamGroups()
        await collecting.write(pb.StreamGroupsRequest(member=_request("open", 0)))
        await _accepted(collecting, 1)
        evaluating = cohorts.StreamGroups()
        for k in range(3):
            await evaluating.write(pb.StreamGroupsRequest(member=_request("hang", k, size=3)))
        await _accepted(evaluating, 3)

        m = await _scrape(server)
        collecting.cancel()
        evaluating.cancel()

    assert m("genrm_cohorts_finished_total", outcome="completed") == 1
    assert m("genrm_cohorts_finished_total", outcome="masked") == 0
    assert m("genrm_cohorts_finished_total", outcome="failed") == 0
    assert m("genrm_cohorts_started_total") == 3
    assert m("genrm_cohort_duration_seconds_count", outcome="completed") == 1
    assert m("genrm_members_total", result="accepted") == 8
    assert m("genrm_members_total", result="replayed") == 1
    assert m("genrm_members_total", result="attached") == 0
    assert m("genrm_members_rejected_total", reason="SLOT_CONFLICT") == 1
    assert m("genrm_members_rejected_total", reason="INVALID_MEMBER") == 1
    assert m("genrm_masked_results_total") == 0
    # Four pairs, each 503 once then ok.
    assert m("genrm_judge_requests_total", outcome="http_503") == 4
    assert m("genrm_judge_requests_total", outcome="ok") == 4
    assert m("genrm_judge_retries_total", cause="http_503") == 4
    assert m("genrm_judge_comparisons_total", outcome="ok") == 4
    assert m("genrm_judge_request_duration_seconds_count") == 8
    assert m("genrm_judge_request_duration_seconds_bucket", le="+Inf") == 8
    assert m("genrm_judge_comparison_duration_seconds_count") == 4
    # Gauges read at scrape time.
    assert m("genrm_cohorts", phase="collecting") == 1
    assert m("genrm_cohorts", phase="evaluating") == 1
    assert m("genrm_active_cohorts") == 2
    assert m("genrm_judge_in_flight") == 1
    assert m("genrm_judge_queue_depth") == 2
    assert m("genrm_tombstones") == 1
    assert m("genrm_attempt_watermarks") == 3
    assert m("genrm_draining") == 0
    # Every name follows the conventions: a genrm_ prefix, counters end in _total,
    # durations are in seconds (token counts in tokens).
    for family in text_string_to_metric_families(m.text):
        if family.name.startswith(("python_", "process_")):
            continue
        assert family.name.startswith("genrm_")
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "histogram":  # in a base unit: seconds, or judge tokens
            assert family.name.endswith(("_seconds", "_tokens"))


async def test_masked_cohorts_and_judge_failures_are_counted(
    server: CohortServer, fake_judge: FakeJudgeServer
) -> None:
    fake_judge.set_faults(fail_400_rate=1.0)  # not retried: the comparison fails at once
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = pb_grpc.CohortServiceStub(channel)
        results = await asyncio.gather(
            *(cohorts.SubmitMember(_request("masked", k, size=2), timeout=30) for k in range(2))
        )
    assert all(r.result.mask_sample for r in results)
    m = await _scrape(server)
    assert m("genrm_cohorts_finished_total", outcome="masked") == 1
    assert m("genrm_masked_results_total") == 2
    assert m("genrm_judge_requests_total", outcome="http_400") >= 1
    assert m("genrm_judge_comparisons_total", outcome="failed") >= 1
    assert m("genrm_tombstones") == 1


async def test_the_endpoint_answers_only_metrics(server: CohortServer) -> None:
    async with httpx.AsyncClient() as http:
        base = f"http://127.0.0.1:{server.metrics_port}"
        assert (await http.get(f"{base}/nope", timeout=10)).status_code == 404
        assert (await http.post(f"{base}/metrics", timeout=10)).status_code == 405
        head = await http.head(f"{base}/metrics", timeout=10)
        assert head.status_code == 200 and head.content == b""


async def test_metrics_are_off_unless_configured(fake_judge: FakeJudgeServer) -> None:
    settings = load_settings(listen="127.0.0.1:0", judge={"url": fake_judge.url})
    assert settings.metrics_listen is None
    server = CohortServer(settings)
    await server.start()
    try:
        assert server.metrics_port is None
    finally:
        await server.stop()
