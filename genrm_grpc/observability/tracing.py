"""OpenTelemetry tracing (the optional ``[otel]`` extra); off unless ``tracing.enabled``.

Spans:

* one SERVER span per RPC (``genrm.cohort.v1.CohortService/SubmitMember``, ...), made by
  :class:`TracingInterceptor`;
* one span per cohort (``cohort``), a root of its own trace, from its first member to its
  terminal disposition; every member call that joins the cohort gets a **link** to it,
  so one trace shows the whole group and each member call leads there;
* one CLIENT span per judge HTTP request (``judge request``), a child of its cohort's
  span (of the Compare call's span for Compare), with the outcome as an attribute, and
  retries as events on the cohort span.

Judge tasks inherit the cohort span because the runtime creates them during a
submission, inside :meth:`Tracing.submitting`, where the cohort span is the current one.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from genrm_grpc.cohort.model import CohortKey
from genrm_grpc.config import TracingSettings
from genrm_grpc.observability.hooks import CohortOutcome, ComparisonOutcome

INSTRUMENTATION = "genrm_grpc"


def build_provider(settings: TracingSettings) -> TracerProvider:
    """A provider exporting to the console or over OTLP (``OTEL_EXPORTER_OTLP_*`` env)."""
    exporter: SpanExporter
    if settings.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        exporter = ConsoleSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "genrm-grpc"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class Tracing:
    """Implements the runtime, judge and submit hooks with spans of one provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(INSTRUMENTATION)
        self._cohorts: dict[CohortKey, trace.Span] = {}
        self._submitting = False
        self._late_tokens: list[object] = []

    # ----------------------------------------------------------- runtime hooks
    def cohort_started(self, key: CohortKey) -> None:
        caller = trace.get_current_span().get_span_context()
        span = self.tracer.start_span(
            "cohort",
            context=otel_context.Context(),  # a root: the cohort outlives any one call
            links=[Link(caller)] if caller.is_valid else None,
            attributes=_key_attributes(key),
        )
        self._cohorts[key] = span
        if self._submitting:
            # Judge tasks this submission starts must run under the cohort's span.
            self._late_tokens.append(otel_context.attach(trace.set_span_in_context(span)))

    def cohort_finished(self, key: CohortKey, outcome: CohortOutcome, age_s: float) -> None:
        span = self._cohorts.pop(key, None)
        if span is None:
            return
        span.set_attribute("genrm.cohort.outcome", outcome)
        if outcome == "failed":
            span.set_status(Status(StatusCode.ERROR, "cohort failed"))
        span.end()

    # ----------------------------------------------------------- judge hooks
    def judge_request(self, outcome: str, seconds: float) -> None:
        # Reported when the request ended: the span is recorded with its real start time.
        end = time.time_ns()
        span = self.tracer.start_span(
            "judge request",
            kind=SpanKind.CLIENT,
            start_time=end - int(seconds * 1e9),
            attributes={"genrm.judge.outcome": outcome},
        )
        if outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end(end_time=end)

    def judge_retry(self, cause: str) -> None:
        trace.get_current_span().add_event("judge retry", {"genrm.judge.cause": cause})

    def judge_comparison(self, outcome: ComparisonOutcome, seconds: float) -> None:
        trace.get_current_span().add_event(
            "judge comparison", {"genrm.judge.outcome": outcome, "genrm.judge.seconds": seconds}
        )

    # ----------------------------------------------------------- submit hook
    @contextmanager
    def submitting(self, key: CohortKey) -> Iterator[None]:
        call = trace.get_current_span()
        cohort = self._cohorts.get(key)
        token = otel_context.attach(trace.set_span_in_context(cohort)) if cohort else None
        self._submitting = True
        try:
            yield
        finally:
            self._submitting = False
            while self._late_tokens:
                otel_context.detach(self._late_tokens.pop())  # type: ignore[arg-type]
            if token is not None:
                otel_context.detach(token)
            cohort = self._cohorts.get(key)
            if cohort is not None and call.is_recording():
                call.add_link(cohort.get_span_context(), _key_attributes(key))

    def shutdown(self) -> None:
        for span in self._cohorts.values():
            span.end()
        self._cohorts.clear()
        self.provider.shutdown()


def _key_attributes(key: CohortKey) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {"genrm.cohort.key": str(key)}
    if key.group_id is not None:
        attributes["genrm.group_id"] = key.group_id
        attributes["genrm.group_attempt"] = key.attempt
    return attributes


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """One SERVER span per RPC, current while the handler runs."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        name = handler_call_details.method.lstrip("/")
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(name, handler.unary_unary), **kwargs
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(name, handler.stream_unary), **kwargs
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(name, handler.unary_stream), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(name, handler.stream_stream), **kwargs
        )

    @contextmanager
    def _span(self, name: str, context: Any) -> Iterator[trace.Span]:
        with self._tracer.start_as_current_span(
            name,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.method": name},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            finally:
                _record_code(span, context)

    def _unary(self, name: str, behavior: Any) -> Any:
        async def traced(request: Any, context: Any) -> Any:
            with self._span(name, context):
                return await behavior(request, context)

        return traced

    def _streaming(self, name: str, behavior: Any) -> Any:
        if not inspect.isasyncgenfunction(behavior):
            # A handler that writes with context.write() and returns.
            return self._unary(name, behavior)

        async def traced(request: Any, context: Any) -> AsyncIterator[Any]:
            with self._span(name, context):
                async for response in behavior(request, context):
                    yield response

        return traced


def _record_code(span: trace.Span, context: Any) -> None:
    code = context.code()
    if code is None:
        code = grpc.StatusCode.OK
    if isinstance(code, grpc.StatusCode):
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code is not grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, code.name))
