"""OpenTelemetry spans per RPC, per judge request and per cohort (in-memory exporter)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from genrm_grpc.config import TracingSettings, load_settings
from genrm_grpc.observability.tracing import build_provider
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
SUBMIT = "genrm.cohort.v1.CohortService/SubmitMember"
COMPARE = "genrm.cohort.v1.CohortService/Compare"


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


def _member(k: int, *, size: int = 3) -> pb.SubmitMemberRequest:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(group_id="traced", group_attempt=0, rollout_index=k, group_size=size),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=f"answer number {k}"),
    )


async def test_one_trace_shows_a_group_and_member_calls_link_to_it(
    fake_judge: FakeJudgeServer,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = load_settings(
        listen="127.0.0.1:0", judge={"url": fake_judge.url}, tracing={"enabled": True}
    )
    server = CohortServer(settings, tracer_provider=provider)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            cohorts = pb_grpc.CohortServiceStub(channel)
            await asyncio.gather(*(cohorts.SubmitMember(_member(k), timeout=30) for k in range(3)))
            await cohorts.Compare(
                pb.CompareRequest(
                    prompt=PROMPT,
                    candidates=[pb.Candidate(output_text="Seven."), pb.Candidate(output_text="")],
                ),
                timeout=30,
            )
            with pytest.raises(grpc.RpcError):
                await cohorts.SubmitMember(_member(5), timeout=10)  # index out of range
    finally:
        await server.stop()
    spans = exporter.get_finished_spans()

    def named(name: str) -> list[ReadableSpan]:
        return [s for s in spans if s.name == name]

    [cohort] = named("cohort")
    assert cohort.parent is None  # its own trace
    assert cohort.attributes is not None
    assert cohort.attributes["genrm.cohort.key"] == "g:traced#0"
    assert cohort.attributes["genrm.cohort.outcome"] == "completed"
    cohort_id = cohort.context.span_id

    submits = named(SUBMIT)
    assert len(submits) == 4 and all(s.kind is SpanKind.SERVER for s in submits)
    linked = [s for s in submits if any(link.context.span_id == cohort_id for link in s.links)]
    assert len(linked) == 3
    [refused] = [s for s in submits if s not in linked]
    assert refused.attributes is not None
    assert refused.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert refused.status.status_code is StatusCode.ERROR

    judged = named("judge request")
    assert len(judged) == fake_judge.stats()["total"]
    in_cohort = [s for s in judged if s.parent is not None and s.parent.span_id == cohort_id]
    assert len(in_cohort) == 3  # circular pairs of a group of three
    assert all(s.context.trace_id == cohort.context.trace_id for s in in_cohort)
    assert all(s.attributes and s.attributes["genrm.judge.outcome"] == "ok" for s in in_cohort)
    [compare] = named(COMPARE)
    in_compare = [
        s for s in judged if s.parent is not None and s.parent.span_id == compare.context.span_id
    ]
    assert len(in_compare) == len(judged) - 3 >= 1


async def test_tracing_is_off_unless_enabled(fake_judge: FakeJudgeServer) -> None:
    server = CohortServer(load_settings(listen="127.0.0.1:0", judge={"url": fake_judge.url}))
    assert server.tracing is None
    await server.judge.aclose()


@pytest.mark.parametrize("exporter", ["console", "otlp"])
def test_configured_exporters_build(exporter: str) -> None:
    provider = build_provider(TracingSettings(enabled=True, exporter=exporter))  # type: ignore[arg-type]
    assert provider.get_tracer("test").start_span("unended").is_recording()
    provider.shutdown()  # nothing ended, so nothing is exported (no collector here)
