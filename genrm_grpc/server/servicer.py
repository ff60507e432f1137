"""The grpc.aio servicer of ``genrm.cohort.v1.CohortService``: wire ⇄ runtime, nothing more."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.cohort.identity import (
    ComparisonMode,
    candidate_spec,
    check_ids,
    coords_metadata,
    prompt_digest,
    resolve,
    resolve_key,
    validate_prompt,
)
from genrm_grpc.cohort.model import (
    CandidateSpec,
    Failed,
    MemberCoords,
    Reason,
    Rejection,
    Submission,
)
from genrm_grpc.cohort.registry import failure_rejection
from genrm_grpc.judge.client import JudgeFailedError
from genrm_grpc.observability.hooks import (
    NullServiceObserver,
    NullSubmitTracer,
    ServiceObserver,
    SubmitTracer,
)
from genrm_grpc.runtime.engine import (
    CohortRuntime,
    CompareCapacityError,
    PairProgress,
    ProgressCallback,
    Ticket,
)
from genrm_grpc.server import convert
from genrm_grpc.server.bounds import FieldBounds
from genrm_grpc.server.errors import abort, status_proto

log = logging.getLogger(__name__)

# grpcio is untyped: the servicer context is Any to mypy.
Context: TypeAlias = Any


class CohortServicer(pb_grpc.CohortServiceServicer):
    def __init__(
        self,
        runtime: CohortRuntime,
        *,
        default_group_size: int,
        mode: ComparisonMode,
        max_message_bytes: int,
        max_call_wait_s: float = 3600.0,
        bounds: FieldBounds | None = None,
        observer: ServiceObserver | None = None,
        tracer: SubmitTracer | None = None,
    ) -> None:
        self._runtime = runtime
        self._group_size = default_group_size
        self._mode = mode
        self._max_bytes = max_message_bytes
        self._max_wait_s = max_call_wait_s
        self._bounds = bounds
        self._observer: ServiceObserver = observer or NullServiceObserver()
        self._tracer: SubmitTracer = tracer or NullSubmitTracer()

    # ------------------------------------------------------------------ helpers
    def _submission(self, request: pb.SubmitMemberRequest) -> Submission | Rejection:
        if request.ByteSize() > self._max_bytes:
            return Rejection(
                Reason.CAPACITY_EXHAUSTED,
                f"member message of {request.ByteSize()} bytes exceeds max_message_bytes="
                f"{self._max_bytes}",
                coords_metadata(convert.coords_from_proto(request.member)),
            )
        if self._bounds is not None:
            out_of_bounds = self._bounds.submission(request)
            if out_of_bounds is not None:
                return out_of_bounds
        if not request.HasField("member"):
            return Rejection(
                Reason.INVALID_MEMBER,
                "invalid member: member is required",
                field_violations=(("member", "required"),),
            )
        return resolve(
            convert.coords_from_proto(request.member),
            convert.prompt_from_proto(request.prompt),
            convert.candidate_from_proto(request.candidate),
            default_group_size=self._group_size,
            mode=self._mode,
        )

    def _outcome_to_result(
        self, sub: Submission, ticket: Ticket, outcome: object
    ) -> pb.MemberResult | Rejection:
        if isinstance(outcome, Failed):
            return failure_rejection(sub.key, outcome, coords_metadata(sub.coords))
        result = convert.member_result(sub.coords, outcome, replayed=False)  # type: ignore[arg-type]
        if result.mask_sample:
            self._observer.masked_result()
        return result

    def _replay(self, sub: Submission, ticket: Ticket) -> pb.MemberResult | Rejection:
        tomb = ticket.replay
        assert tomb is not None
        failed = tomb.failed
        if failed is not None:
            return failure_rejection(sub.key, failed, coords_metadata(sub.coords))
        outcome = tomb.outcome  # unpacked once, here
        assert not isinstance(outcome, Failed)
        result = convert.member_result(sub.coords, outcome, replayed=True)
        if result.mask_sample:
            self._observer.masked_result()
        return result

    def _rejected(self, rejection: Rejection) -> Rejection:
        self._observer.member_rejected(rejection.reason.value)
        return rejection

    def _submit(self, sub: Submission, on_progress: ProgressCallback | None = None) -> Ticket:
        with self._tracer.submitting(sub.key):
            ticket = self._runtime.submit(sub, on_progress=on_progress)
        if ticket.rejection is not None:
            self._observer.member_rejected(ticket.rejection.reason.value)
        else:
            self._observer.member_result(ticket.disposition.value)
        return ticket

    def _wait_cap(self, context: Context) -> float | None:
        """How long a call may wait: unbounded with a client deadline, else max_call_wait_s."""
        return None if context.time_remaining() is not None else self._max_wait_s

    def _wait_expired(self, meta: dict[str, str]) -> Rejection:
        return Rejection(
            Reason.CALL_WAIT_EXPIRED,
            f"the call waited max_call_wait_s={self._max_wait_s:g} without a client deadline; "
            "a submitted member stays in its cohort: resend it (with a deadline) to reattach",
            meta,
        )

    # ------------------------------------------------------------------ RPCs
    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Context
    ) -> pb.SubmitMemberResponse:
        sub = self._submission(request)
        if isinstance(sub, Rejection):
            await abort(context, self._rejected(sub))
        ticket = self._submit(sub)
        if ticket.rejection is not None:
            await abort(context, ticket.rejection)
        if ticket.replay is not None:
            answer = self._replay(sub, ticket)
        else:
            assert ticket.waiter is not None
            # A cancelled or expired call ends here; Waiter.wait removes only this waiter.
            try:
                async with asyncio.timeout(self._wait_cap(context)):
                    outcome = await ticket.waiter.wait()
            except TimeoutError:
                await abort(context, self._wait_expired(coords_metadata(sub.coords)))
            answer = self._outcome_to_result(sub, ticket, outcome)
        if isinstance(answer, Rejection):
            await abort(context, answer)
        return pb.SubmitMemberResponse(result=answer)

    async def StreamGroups(
        self, request_iterator: AsyncIterator[pb.StreamGroupsRequest], context: Context
    ) -> AsyncIterator[pb.StreamGroupsResponse]:
        stream = _GroupStream(self, request_iterator)
        async for event in stream.events():
            yield event

    async def Compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
        refusal = self._compare_refusal(request)
        if refusal is not None:
            self._observer.compare_finished("rejected")
            await abort(context, refusal)
        try:
            async with asyncio.timeout(self._wait_cap(context)):
                response = await self._compare(request, context)
        except TimeoutError:
            self._observer.compare_finished("rejected")
            await abort(context, self._wait_expired({}))
        except CompareCapacityError as exc:
            self._observer.compare_finished("rejected")
            await abort(context, Rejection(Reason.CAPACITY_EXHAUSTED, str(exc)))
        except JudgeFailedError as exc:
            self._observer.compare_finished("judge_failed")
            await abort(context, Rejection(Reason.JUDGE_FAILED, f"judge failed: {exc.reason}"))
            raise AssertionError("unreachable") from exc
        self._observer.compare_finished("ok")
        return response

    def _compare_refusal(self, request: pb.CompareRequest) -> Rejection | None:
        if request.ByteSize() > self._max_bytes:
            return Rejection(
                Reason.CAPACITY_EXHAUSTED,
                f"request of {request.ByteSize()} bytes exceeds max_message_bytes",
            )
        if self._runtime.registry.draining:
            return Rejection(Reason.SHUTTING_DOWN, "the server is shutting down")
        if self._bounds is not None:
            return self._bounds.compare(request)
        return None

    async def _compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
        prompt = convert.prompt_from_proto(request.prompt)
        bad = validate_prompt(prompt, self._mode)
        if bad is None and not request.candidates:
            bad = Rejection(
                Reason.INVALID_MEMBER,
                "invalid request: at least one candidate is required",
                field_violations=(("candidates", "at least one candidate is required"),),
            )
        candidates: list[CandidateSpec] = []
        for n, candidate in enumerate(request.candidates):
            if bad is not None:
                break
            spec = candidate_spec(convert.candidate_from_proto(candidate))
            if isinstance(spec, Rejection):
                bad = Rejection(
                    spec.reason,
                    spec.message.replace("candidate", f"candidates[{n}]", 1),
                    field_violations=tuple(
                        (f.replace("candidate", f"candidates[{n}]", 1), d)
                        for f, d in spec.field_violations
                    ),
                )
            else:
                candidates.append(spec)
        if bad is not None:
            self._observer.compare_finished("rejected")
            await abort(context, bad)
        scores = await self._runtime.compare(prompt, candidates)
        response = pb.CompareResponse(rewards=[r.reward for r in scores.rewards])
        response.comparisons.extend(convert.verdicts_to_proto(scores.judged))
        response.metrics.update(dict(scores.metrics))
        return response

    async def GetCohort(
        self, request: pb.GetCohortRequest, context: Context
    ) -> pb.GetCohortResponse:
        coords = convert.coords_from_proto(request.member)
        bad_ids = check_ids(coords)
        if bad_ids is not None:
            await abort(context, bad_ids)
        registry = self._runtime.registry
        now = self._runtime.now()
        latest = None
        if coords.group_id is not None:
            latest = registry.latest_attempt(coords.group_id, now)
            if coords.group_attempt is None and latest is not None:
                # Operators usually want the newest attempt when they name only the group.
                coords = MemberCoords(
                    rollout_index=0, group_id=coords.group_id, group_attempt=latest
                )
        key = resolve_key(coords, prompt_digest(convert.prompt_from_proto(request.prompt)))
        cohort = registry.active(key)
        found = cohort if cohort is not None else registry.store.tombstone(key, now)
        if found is None:
            meta = {}
            if key.group_id is not None:
                meta = coords_metadata(None, groupId=key.group_id, groupAttempt=str(key.attempt))
            await abort(
                context,
                Rejection(Reason.COHORT_NOT_FOUND, f"no cohort {key} on this server", meta),
            )
        return pb.GetCohortResponse(
            cohort=convert.cohort_info(found, latest_attempt=latest, now=now)
        )


class _GroupStream:
    """One StreamGroups call: reads members while results are written back."""

    def __init__(
        self, servicer: CohortServicer, requests: AsyncIterator[pb.StreamGroupsRequest]
    ) -> None:
        self._servicer = servicer
        self._requests = requests
        self._queue: asyncio.Queue[pb.StreamGroupsResponse | None] = asyncio.Queue()
        self._waits: set[asyncio.Task[None]] = set()
        self._outstanding = 0  # members accepted on this stream still without an outcome
        self._group_refs: dict[object, pb.MemberRef] = {}

    def _on_progress(self, progress: PairProgress) -> None:
        ref = self._group_refs.get(progress.key)
        if ref is None:
            return
        self._queue.put_nowait(
            pb.StreamGroupsResponse(
                pair_judged=pb.PairJudged(
                    member=ref,
                    response_i=progress.response_i,
                    response_j=progress.response_j,
                    judge_index=progress.judge_index,
                )
            )
        )

    def _error(self, ref: pb.MemberRef, rejection: Rejection) -> pb.StreamGroupsResponse:
        return pb.StreamGroupsResponse(
            error=pb.MemberError(member=ref, status=status_proto(rejection))
        )

    def _handle(self, request: pb.StreamGroupsRequest) -> None:
        ref = request.member.member
        sub = self._servicer._submission(request.member)
        if isinstance(sub, Rejection):
            self._queue.put_nowait(self._error(ref, self._servicer._rejected(sub)))
            return
        group_ref = convert.coords_to_proto(sub.coords)
        self._group_refs.setdefault(sub.key, group_ref)
        ticket = self._servicer._submit(sub, self._on_progress)
        if ticket.rejection is not None:
            self._queue.put_nowait(self._error(ref, ticket.rejection))
            return
        self._queue.put_nowait(pb.StreamGroupsResponse(accepted=pb.MemberAccepted(member=ref)))
        if ticket.replay is not None:
            self._put_answer(ref, self._servicer._replay(sub, ticket))
            return
        self._outstanding += 1
        task = asyncio.create_task(self._wait(sub, ticket, ref))
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    def _put_answer(self, ref: pb.MemberRef, answer: pb.MemberResult | Rejection) -> None:
        if isinstance(answer, Rejection):
            self._queue.put_nowait(self._error(ref, answer))
        else:
            self._queue.put_nowait(pb.StreamGroupsResponse(result=answer))

    async def _wait(self, sub: Submission, ticket: Ticket, ref: pb.MemberRef) -> None:
        assert ticket.waiter is not None
        outcome = await ticket.waiter.wait()
        self._outstanding -= 1
        self._put_answer(ref, self._servicer._outcome_to_result(sub, ticket, outcome))
        self._queue.put_nowait(None)  # wake the writer to check whether we are done

    async def _read(self) -> None:
        try:
            async for request in self._requests:
                self._handle(request)
        finally:
            self._queue.put_nowait(None)

    async def events(self) -> AsyncIterator[pb.StreamGroupsResponse]:
        reader = asyncio.create_task(self._read())
        try:
            while True:
                event = await self._queue.get()
                if event is not None:
                    yield event
                elif reader.done() and self._outstanding == 0 and self._queue.empty():
                    reader.result()  # re-raise a broken request stream
                    return
        finally:
            # The client went away or the stream ended: drop our waiters only.
            reader.cancel()
            for task in list(self._waits):
                task.cancel()
            await asyncio.gather(reader, *self._waits, return_exceptions=True)
