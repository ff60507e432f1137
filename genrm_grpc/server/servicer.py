"""The grpc.aio servicer of ``genrm.cohort.v1.CohortService``: wire ⇄ runtime, nothing more.

What a request must satisfy before the runtime sees it is ``admission.py``'s; what the
runtime answers is translated here into responses and typed errors. One StreamGroups
call is a ``GroupStream`` (``group_stream.py``), which writes the answers made here as
stream events.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import weakref
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.cohort.identity import (
    check_ids,
    coords_metadata,
)
from genrm_grpc.cohort.model import (
    CohortKey,
    Failed,
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
from genrm_grpc.runtime.live import (
    CallInterrupted,
    CompareCapacityError,
    ProgressCallback,
    Runtime,
    Ticket,
)
from genrm_grpc.server import convert
from genrm_grpc.server.admission import Admission
from genrm_grpc.server.errors import abort
from genrm_grpc.server.group_stream import GroupStream

log = logging.getLogger(__name__)

# grpcio is untyped: the servicer context is Any to mypy.
Context: TypeAlias = Any

#: Initial-metadata key of every CohortService answer: the id this server process minted
#: at start (docs/protocol.md, "Response metadata"). A client that sees it change while a
#: call waits knows that it now talks to another process (a restart or another server).
SERVER_INSTANCE_METADATA = "x-genrm-server-instance"


def new_instance_id() -> str:
    """A random id for one server process (64 bits, hex)."""
    return secrets.token_hex(8)


class CohortServicer(pb_grpc.CohortServiceServicer):
    def __init__(
        self,
        runtime: Runtime,
        admission: Admission,
        *,
        observer: ServiceObserver | None = None,
        tracer: SubmitTracer | None = None,
        instance_id: str | None = None,
    ) -> None:
        #: This process's id, in the trailing metadata of every CohortService call and,
        #: before it waits (for members, a judge, a stream's requests), in its initial
        #: metadata (docs/protocol.md, "Metadata").
        self.instance_id = instance_id or new_instance_id()
        self._instance_metadata = ((SERVER_INSTANCE_METADATA, self.instance_id),)
        self._runtime = runtime
        self.admission = admission
        self._observer: ServiceObserver = observer or NullServiceObserver()
        self._tracer: SubmitTracer = tracer or NullSubmitTracer()
        #: The StreamGroups streams open now (for operators and tests).
        self.open_streams: weakref.WeakSet[GroupStream] = weakref.WeakSet()

    @property
    def held_by_connection(self) -> dict[str, int]:
        """Bytes held by the StreamGroups streams of each connection (no zero entries)."""
        return self.admission.held_by_connection

    # ------------------------------------------------- answers (also for GroupStream)
    def outcome_answer(
        self, sub: Submission, ticket: Ticket, outcome: object
    ) -> pb.MemberResult | Rejection:
        if isinstance(outcome, Failed):
            return failure_rejection(sub.key, outcome, coords_metadata(sub.coords))
        result = convert.member_result(sub.coords, outcome, replayed=False)  # type: ignore[arg-type]
        if result.mask_sample:
            self._observer.masked_result()
        return result

    def replay_answer(self, sub: Submission, ticket: Ticket) -> pb.MemberResult | Rejection:
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

    def interrupted(self, sub: Submission, exc: CallInterrupted) -> Rejection:
        return self._rejected(Rejection(exc.reason, exc.message, coords_metadata(sub.coords)))

    def _rejected(self, rejection: Rejection) -> Rejection:
        self._observer.member_rejected(rejection.reason.value)
        return rejection

    async def submit(self, sub: Submission, on_progress: ProgressCallback | None = None) -> Ticket:
        """The runtime's decision on one member, counted; raises CallInterrupted
        (STORE_UNAVAILABLE) when the store cannot be read or written."""
        with self._tracer.submitting(sub.key):
            ticket = await self._runtime.submit(sub, on_progress=on_progress)
        if ticket.rejection is not None:
            self._observer.member_rejected(ticket.rejection.reason.value)
        else:
            self._observer.member_result(ticket.disposition.value)
        return ticket

    # ------------------------------------------------------------------ RPCs
    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Context
    ) -> pb.SubmitMemberResponse:
        context.set_trailing_metadata(self._instance_metadata)
        admission = self.admission
        sub = admission.member(request, admission.principal(context))
        if isinstance(sub, Rejection):
            await abort(context, self._rejected(sub))
        try:
            ticket = await self.submit(sub)
        except CallInterrupted as exc:
            await abort(context, self.interrupted(sub, exc))
        if ticket.rejection is not None:
            await abort(context, ticket.rejection)
        try:
            # Nothing is answered before what it depends on is in the store. A replay
            # waits for its outcome's write; a waiting member needs no wait of its own
            # (its outcome is published only once written, after the member), but fails
            # at once with STORE_UNAVAILABLE if the member's own write fails.
            if ticket.replay is not None:
                await ticket.persisted()
                answer = self.replay_answer(sub, ticket)
            else:
                waiter = ticket.waiter
                assert waiter is not None
                ticket.interrupt_if_unwritten()
                if waiter.future.done():
                    # Ended in its own decision (a 1-member cohort): nothing to wait for,
                    # so the instance id travels in the trailing metadata only.
                    outcome = waiter.future.result()
                else:
                    await context.send_initial_metadata(self._instance_metadata)
                    # A cancelled or expired call ends here; Waiter.wait removes only
                    # this waiter.
                    try:
                        async with asyncio.timeout(admission.wait_cap(context)):
                            outcome = await waiter.wait()
                    except TimeoutError:
                        await abort(context, admission.wait_expired(coords_metadata(sub.coords)))
                answer = self.outcome_answer(sub, ticket, outcome)
        except CallInterrupted as exc:
            answer = self.interrupted(sub, exc)
        finally:
            # However the call ends (answered, interrupted, cancelled by the client while
            # its member was being written), its waiter goes; the member stays.
            if ticket.waiter is not None:
                ticket.waiter.release()
        if isinstance(answer, Rejection):
            await abort(context, answer)
        return pb.SubmitMemberResponse(result=answer)

    async def StreamGroups(
        self, request_iterator: AsyncIterator[pb.StreamGroupsRequest], context: Context
    ) -> None:
        context.set_trailing_metadata(self._instance_metadata)
        await context.send_initial_metadata(self._instance_metadata)
        principal = self.admission.principal(context)
        stream = GroupStream(self, request_iterator, context.peer(), principal)
        self.open_streams.add(stream)
        # Written straight to the call (no async-generator layers per event).
        await stream.run(context.write)

    async def Compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
        context.set_trailing_metadata(self._instance_metadata)
        await context.send_initial_metadata(self._instance_metadata)
        admission = self.admission
        refusal = admission.compare_refusal(request, draining=self._runtime.draining)
        if refusal is not None:
            self._observer.compare_finished("rejected")
            await abort(context, refusal)
        try:
            principal = admission.principal(context)
            with admission.compare_passes_of(request, principal) as quota_refusal:
                if quota_refusal is not None:
                    self._observer.compare_finished("rejected")
                    await abort(context, quota_refusal)
                async with asyncio.timeout(admission.wait_cap(context)):
                    response = await self._compare(request, context)
        except TimeoutError:
            self._observer.compare_finished("rejected")
            await abort(context, admission.wait_expired({}))
        except CompareCapacityError as exc:
            self._observer.compare_finished("rejected")
            await abort(context, Rejection(Reason.CAPACITY_EXHAUSTED, str(exc)))
        except JudgeFailedError as exc:
            self._observer.compare_finished("judge_failed")
            await abort(context, Rejection(Reason.JUDGE_FAILED, f"judge failed: {exc.reason}"))
            raise AssertionError("unreachable") from exc
        self._observer.compare_finished("ok")
        return response

    async def _compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
        inputs = self.admission.compare_inputs(request)
        if isinstance(inputs, Rejection):
            self._observer.compare_finished("rejected")
            await abort(context, inputs)
        prompt, candidates = inputs
        scores = await self._runtime.compare(prompt, candidates)
        response = pb.CompareResponse(rewards=[r.reward for r in scores.rewards])
        response.comparisons.extend(convert.verdicts_to_proto(scores.judged))
        response.metrics.update(dict(scores.metrics))
        return response

    async def GetCohort(
        self, request: pb.GetCohortRequest, context: Context
    ) -> pb.GetCohortResponse:
        context.set_trailing_metadata(self._instance_metadata)
        coords = convert.coords_from_proto(request.member)
        bad_ids = check_ids(coords)
        if bad_ids is not None:
            await abort(context, bad_ids)
        principal = self.admission.principal(context)  # a caller sees only its own cohorts
        latest = None
        first = CohortKey(coords.group_id, None, coords.group_attempt or 0, principal)
        try:
            if coords.group_id is not None:
                # The group's view holds its watermark and its newest attempt.
                registry, now = await self._runtime.view(first)
            else:
                registry = None
        except CallInterrupted as exc:
            await abort(context, self._rejected(Rejection(exc.reason, exc.message)))
        if coords.group_id is not None:
            assert registry is not None
            latest = registry.latest_attempt(coords.group_id, now, principal)
            coords = Admission.newest_attempt(coords, latest)
        key = Admission.cohort_key(coords, convert.prompt_from_proto(request.prompt), principal)
        if registry is None:
            try:
                registry, now = await self._runtime.view(key)
            except CallInterrupted as exc:
                await abort(context, self._rejected(Rejection(exc.reason, exc.message)))
        found = registry.lookup(key, now)
        if found is None:
            meta = {}
            if key.group_id is not None:
                meta = coords_metadata(None, groupId=key.group_id, groupAttempt=str(key.attempt))
            await abort(
                context,
                Rejection(Reason.COHORT_NOT_FOUND, f"no cohort {key} on this server", meta),
            )
        return pb.GetCohortResponse(
            cohort=convert.cohort_info(
                found,
                latest_attempt=latest,
                now=now,
                passes=self._runtime.passes_taken(key),
                judge=self._runtime.judge_progress(key),
            )
        )
