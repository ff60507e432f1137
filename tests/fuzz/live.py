"""A live in-process server on an event loop in a background thread, for hypothesis.

Hypothesis drives synchronous test functions; each example submits its coroutine to the
server's loop. A *bystander* cohort collects while the fuzzing runs and is completed
afterwards; a background loop completes whole groups alongside the fuzzing. Both check
their rewards against :func:`genrm_grpc.scoring.aggregate` on the verdicts returned.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from genrm_grpc.config import load_settings
from genrm_grpc.scoring import AnswerTexts, JudgedPair, Verdict, aggregate
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

T = TypeVar("T")
DOMAIN = "cohort.genrm.v1"
REASONS = {
    grpc.StatusCode.INVALID_ARGUMENT: {"INVALID_MEMBER"},
    grpc.StatusCode.RESOURCE_EXHAUSTED: {"CAPACITY_EXHAUSTED"},
    grpc.StatusCode.FAILED_PRECONDITION: {"COHORT_CLOSED", "PROMPT_MISMATCH", "ATTEMPT_SUPERSEDED"},
    grpc.StatusCode.ALREADY_EXISTS: {"SLOT_CONFLICT"},
    grpc.StatusCode.ABORTED: {"COHORT_FAILED"},
    grpc.StatusCode.UNAVAILABLE: {"JUDGE_FAILED"},  # Compare only
    grpc.StatusCode.DEADLINE_EXCEEDED: {"CALL_WAIT_EXPIRED"},  # a call without a deadline
    grpc.StatusCode.NOT_FOUND: {"COHORT_NOT_FOUND"},  # GetCohort only
}
METADATA_KEYS = {"groupId", "groupAttempt", "rolloutIndex", "latestAttempt"}
PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Explain unit testing briefly.")])
ANSWERS = (
    "Unit testing checks small pieces of code in isolation so bugs are caught early.",
    "Testing units.",
    "Unit testing is a way to test each unit of code briefly and explain failures.",
    "",
)


@dataclass(frozen=True)
class TypedError:
    code: grpc.StatusCode
    reason: str
    error_infos: int
    field_violations: int
    metadata: dict[str, str]
    domain: str
    message: str


def typed_error(
    code: grpc.StatusCode, status: status_pb2.Status | None, message: str
) -> TypedError:
    infos: list[error_details_pb2.ErrorInfo] = []
    violations = 0
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                infos.append(info)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations += len(bad.field_violations)
    first = infos[0] if infos else error_details_pb2.ErrorInfo()
    return TypedError(
        code, first.reason, len(infos), violations, dict(first.metadata), first.domain, message
    )


def call_error(exc: grpc.RpcError) -> TypedError:
    return typed_error(exc.code(), rpc_status.from_call(exc), exc.details() or "")


def stream_error(status: status_pb2.Status) -> TypedError:
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), grpc.StatusCode.UNKNOWN)
    return typed_error(code, status, status.message)


def assert_typed(err: TypedError) -> None:
    """A refusal of docs/protocol.md: a known code, exactly one ErrorInfo of our domain."""
    assert err.code in REASONS, f"untyped status {err.code}: {err.message[:300]}"
    assert err.error_infos == 1, f"{err.code} carries {err.error_infos} ErrorInfo"
    assert err.domain == DOMAIN, err
    assert err.reason in REASONS[err.code], f"{err.code} with reason {err.reason!r}"
    assert set(err.metadata) <= METADATA_KEYS, err.metadata
    if err.code == grpc.StatusCode.INVALID_ARGUMENT:
        assert err.field_violations >= 1, "INVALID_ARGUMENT without field violations"


def check_rewards(
    texts: list[AnswerTexts], rewards: list[float], verdicts: list[pb.PairVerdict], scoring: Any
) -> None:
    """Rewards equal aggregate() of the verdicts the server returned (circular order)."""
    n = len(texts)
    by_pair = {(v.judge_index, v.response_i, v.response_j): v for v in verdicts}
    expected = [(0, i, (i + 1) % n) for i in range(n)] if n >= 2 else []
    assert sorted(by_pair) == sorted(expected), sorted(by_pair)
    judged = [
        JudgedPair(i, j, k, Verdict(v.score_1, v.score_2, v.ranking, v.parse_failed))
        for k, i, j in expected
        for v in [by_pair[(k, i, j)]]
    ]
    scores = aggregate(texts, judged, scoring)
    assert all(math.isfinite(r) for r in rewards)
    assert rewards == [m.reward for m in scores.members]


class LiveServer:
    """The server, the fake judge and a client channel on a background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="fuzz-server", daemon=True
        )
        self.judge = FakeJudgeServer(FakeJudgeConfig())
        self.server: CohortServer | None = None
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.CohortServiceStub | None = None
        self.bystander_groups = 0
        self._alongside: asyncio.Task[None] | None = None
        self._stop_alongside: asyncio.Event | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def start(self) -> None:
        self.judge.start()
        self._thread.start()
        self.run(self._start())

    async def _start(self) -> None:
        settings = load_settings(
            listen="127.0.0.1:0",
            judge={"url": self.judge.url},
            genrm_parse_retry_sleep_s=0.01,
            cohort_collection_timeout_s=120,
            max_message_bytes=64 * 1024,
            shutdown_grace_s=1.0,
        )
        self.server = CohortServer(settings)
        port = await self.server.start()
        self.target = f"127.0.0.1:{port}"
        self.channel = grpc.aio.insecure_channel(self.target)
        self.stub = pb_grpc.CohortServiceStub(self.channel)

    def stop(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        self.judge.stop()

    async def _stop(self) -> None:
        assert self.channel is not None and self.server is not None
        await self.channel.close(None)
        await self.server.stop()

    @property
    def scoring(self) -> Any:
        assert self.server is not None
        return self.server.settings

    def raw(self, method: str) -> Any:
        """A call that sends arbitrary bytes and returns raw bytes (identity serializers)."""
        assert self.channel is not None
        return self.channel.unary_unary(
            f"/genrm.cohort.v1.CohortService/{method}",
            request_serializer=None,
            response_deserializer=None,
        )

    async def send_raw(self, method: str, raw: bytes, timeout: float) -> bytes:
        response: bytes = await self.raw(method)(raw, timeout=timeout)
        return response

    # ------------------------------------------------------------ bystanders
    def _member(self, gid: str, k: int, size: int) -> pb.SubmitMemberRequest:
        return pb.SubmitMemberRequest(
            member=pb.MemberRef(group_id=gid, group_attempt=0, rollout_index=k, group_size=size),
            prompt=PROMPT,
            candidate=pb.Candidate(output_text=ANSWERS[k % len(ANSWERS)] + f" ({gid})" * (k != 3)),
        )

    async def _submit(self, request: pb.SubmitMemberRequest) -> pb.MemberResult:
        assert self.stub is not None
        response = await self.stub.SubmitMember(request, timeout=60)
        result: pb.MemberResult = response.result
        return result

    def _verify_group(
        self, requests: list[pb.SubmitMemberRequest], results: list[pb.MemberResult]
    ) -> None:
        assert not any(r.mask_sample for r in results)
        texts = [AnswerTexts(r.candidate.reasoning_text, r.candidate.output_text) for r in requests]
        verdicts = {
            (v.judge_index, v.response_i, v.response_j): v for r in results for v in r.comparisons
        }
        check_rewards(texts, [r.reward for r in results], list(verdicts.values()), self.scoring)
        assert len({tuple(sorted(r.group_metrics.items())) for r in results}) == 1

    async def start_bystander(self, gid: str, size: int = 4) -> Bystander:
        """Members 0..size-2 on a stream, accepted before the fuzzing starts; they wait."""
        assert self.stub is not None
        queue: asyncio.Queue[pb.StreamGroupsRequest | None] = asyncio.Queue()
        requests = [self._member(gid, k, size) for k in range(size)]
        for request in requests[:-1]:
            queue.put_nowait(pb.StreamGroupsRequest(member=request))

        async def feed() -> Any:
            while (item := await queue.get()) is not None:
                yield item

        call = self.stub.StreamGroups(feed(), timeout=120)
        events = aiter(call)
        accepted = 0
        while accepted < size - 1:
            event = await anext(events)
            assert event.WhichOneof("event") == "accepted", event
            accepted += 1
        self._stop_alongside = asyncio.Event()
        self._alongside = asyncio.create_task(self._groups_alongside(gid))
        return Bystander(requests, queue, events)

    async def finish_bystander(self, bystander: Bystander) -> None:
        """Stop the groups alongside, send the last member, check everyone's rewards."""
        assert self._stop_alongside is not None and self._alongside is not None
        self._stop_alongside.set()
        await self._alongside
        assert self.bystander_groups >= 1, "no group completed alongside the fuzzing"
        last = await self._submit(bystander.requests[-1])
        bystander.queue.put_nowait(None)
        results = {}
        async for event in bystander.events:
            if event.WhichOneof("event") == "result":
                results[event.result.member.rollout_index] = event.result
        ordered = [results[k] for k in range(len(bystander.requests) - 1)] + [last]
        self._verify_group(bystander.requests, ordered)

    async def _groups_alongside(self, prefix: str) -> None:
        """Whole groups completing while the fuzzing runs; each one's rewards checked."""
        assert self._stop_alongside is not None
        n = 0
        while not self._stop_alongside.is_set() or n == 0:
            gid = f"{prefix}/alongside/{n}"
            requests = [self._member(gid, k, 3) for k in range(3)]
            results = await asyncio.gather(*(self._submit(r) for r in requests))
            self._verify_group(requests, list(results))
            n += 1
            self.bystander_groups += 1


@dataclass
class Bystander:
    requests: list[pb.SubmitMemberRequest]
    queue: asyncio.Queue[pb.StreamGroupsRequest | None]
    events: Any
