"""The grpc.aio servicer of ``genrm.cohort.v1.CohortService``: wire ⇄ runtime, nothing more.

What a request must satisfy before the runtime sees it is ``admission.py``'s; what the
runtime answers is translated here into responses, stream events and typed errors.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2

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
from genrm_grpc.runtime.engine import CohortRuntime
from genrm_grpc.runtime.live import (
    CallInterrupted,
    CompareCapacityError,
    PairProgress,
    ProgressCallback,
    Ticket,
)
from genrm_grpc.server import convert
from genrm_grpc.server.admission import Admission
from genrm_grpc.server.errors import DOMAIN, abort, status_proto
from genrm_grpc.server.interceptors import is_undecodable

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
        runtime: CohortRuntime,
        admission: Admission,
        *,
        observer: ServiceObserver | None = None,
        tracer: SubmitTracer | None = None,
        instance_id: str | None = None,
    ) -> None:
        #: This process's id, sent first (initial metadata) on every CohortService call.
        self.instance_id = instance_id or new_instance_id()
        self._instance_metadata = ((SERVER_INSTANCE_METADATA, self.instance_id),)
        self._runtime = runtime
        self.admission = admission
        self._observer: ServiceObserver = observer or NullServiceObserver()
        self._tracer: SubmitTracer = tracer or NullSubmitTracer()
        #: The StreamGroups streams open now (for operators and tests).
        self.open_streams: weakref.WeakSet[_GroupStream] = weakref.WeakSet()

    @property
    def held_by_connection(self) -> dict[str, int]:
        """Bytes held by the StreamGroups streams of each connection (no zero entries)."""
        return self.admission.held_by_connection

    # ------------------------------------------------------------------ helpers
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

    def _interrupted(self, sub: Submission, exc: CallInterrupted) -> Rejection:
        return self._rejected(Rejection(exc.reason, exc.message, coords_metadata(sub.coords)))

    def _rejected(self, rejection: Rejection) -> Rejection:
        self._observer.member_rejected(rejection.reason.value)
        return rejection

    async def _submit(self, sub: Submission, on_progress: ProgressCallback | None = None) -> Ticket:
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
        await context.send_initial_metadata(self._instance_metadata)
        admission = self.admission
        sub = admission.member(request, admission.principal(context))
        if isinstance(sub, Rejection):
            await abort(context, self._rejected(sub))
        try:
            ticket = await self._submit(sub)
        except CallInterrupted as exc:
            await abort(context, self._interrupted(sub, exc))
        if ticket.rejection is not None:
            await abort(context, ticket.rejection)
        try:
            # Nothing is answered before what it depends on is in the store. A replay
            # waits for its outcome's write; a waiting member needs no wait of its own
            # (its outcome is published only once written, after the member), but fails
            # at once with STORE_UNAVAILABLE if the member's own write fails.
            if ticket.replay is not None:
                await ticket.persisted()
                answer = self._replay(sub, ticket)
            else:
                assert ticket.waiter is not None
                ticket.interrupt_if_unwritten()
                # A cancelled or expired call ends here; Waiter.wait removes only this waiter.
                try:
                    async with asyncio.timeout(admission.wait_cap(context)):
                        outcome = await ticket.waiter.wait()
                except TimeoutError:
                    await abort(context, admission.wait_expired(coords_metadata(sub.coords)))
                answer = self._outcome_to_result(sub, ticket, outcome)
        except CallInterrupted as exc:
            answer = self._interrupted(sub, exc)
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
        await context.send_initial_metadata(self._instance_metadata)
        principal = self.admission.principal(context)
        stream = _GroupStream(self, request_iterator, context.peer(), principal)
        self.open_streams.add(stream)
        # Written straight to the call (no async-generator layers per event).
        await stream.run(context.write)

    async def Compare(self, request: pb.CompareRequest, context: Context) -> pb.CompareResponse:
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
        await context.send_initial_metadata(self._instance_metadata)
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


#: ErrorInfo reason of a member whose handling hit a server bug (status INTERNAL).
INTERNAL_REASON = "INTERNAL"


def _internal_status(message: str) -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(reason=INTERNAL_REASON, domain=DOMAIN)
    packed = status_pb2.Status(code=code_pb2.INTERNAL, message=message)
    packed.details.add().Pack(info)
    return packed


class _Held:
    """A member of this stream awaiting its outcome."""

    __slots__ = ("cost", "ref", "sub", "ticket")

    def __init__(self, sub: Submission, ticket: Ticket, ref: pb.MemberRef, cost: int) -> None:
        self.sub = sub
        self.ticket = ticket
        self.ref = ref
        self.cost = cost


class _GroupStream:
    """One StreamGroups call: reads members while events are written back.

    Bookkeeping is per member held, never per member seen: a held member is one entry in
    ``_held`` (keyed by its waiter's future, settled by a done callback, not a task), and
    a group is one entry in ``_groups`` while this stream holds members of it. A long-lived
    stream therefore costs what it holds now, not what it carried before.

    Backpressure: events wait in ``_out`` for the writer, which sends them only as fast as
    the client reads (grpc.aio's write waits for HTTP/2 flow control). When ``_out`` holds
    ``max_buffered_events`` the reader stops reading requests, so gRPC flow control pushes
    back on the client's writes. Outcomes of held members and progress are produced by the
    cohorts, not by reading: outcomes are always queued (there are at most as many as held
    members, which the byte bounds limit) and progress events are dropped while the buffer
    is full (progress is informational).
    """

    def __init__(
        self,
        servicer: CohortServicer,
        requests: AsyncIterator[pb.StreamGroupsRequest],
        peer: str,
        principal: str,
    ) -> None:
        self._servicer = servicer
        self._requests = requests
        self._limits = servicer.admission.stream_limits
        self._bytes = servicer.admission.stream(peer)
        self._principal = principal
        self._out: deque[pb.StreamGroupsResponse] = deque()
        self._wake = asyncio.Event()  # the writer has something to do
        self._room = asyncio.Event()  # the reader may read: _out is below its bound
        self._room.set()
        self._held: dict[asyncio.Future[Any], _Held] = {}
        self._groups: dict[CohortKey, list[Any]] = {}  # key → [group ref, members held]
        self._reading = True
        self._replays_pending = 0  # replays waiting for their outcome to be written
        # Members whose decision is in flight (on a shared store, a Redis read and commit).
        self._deciding: set[asyncio.Task[None]] = set()
        self._unaccepted = 0  # held members waiting to be written before "accepted"
        self._on_progress_cb = self._on_progress
        self._on_settled_cb = self._on_settled
        self.progress_dropped = 0

    # ------------------------------------------------------------------ events out
    def _push(self, event: pb.StreamGroupsResponse) -> None:
        self._out.append(event)
        self._wake.set()

    def _error(self, ref: pb.MemberRef, rejection: Rejection) -> None:
        self._push(
            pb.StreamGroupsResponse(
                error=pb.MemberError(member=ref, status=status_proto(rejection))
            )
        )

    def _answer(self, ref: pb.MemberRef, answer: pb.MemberResult | Rejection) -> None:
        if isinstance(answer, Rejection):
            self._error(ref, answer)
        else:
            self._push(pb.StreamGroupsResponse(result=answer))

    def _internal(self, ref: pb.MemberRef, what: str, exc: BaseException) -> None:
        log.exception("StreamGroups: %s failed for one member; the stream goes on", what)
        status = _internal_status(f"internal error while {what}: {type(exc).__name__}")
        self._push(pb.StreamGroupsResponse(error=pb.MemberError(member=ref, status=status)))

    @property
    def held_members(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        return self._bytes.held

    @property
    def groups_held(self) -> int:
        return len(self._groups)

    def _on_progress(self, progress: PairProgress) -> None:
        group = self._groups.get(progress.key)
        if group is None:
            return
        if len(self._out) >= self._limits.stream_max_buffered_events:
            self.progress_dropped += 1
            return
        self._push(
            pb.StreamGroupsResponse(
                pair_judged=pb.PairJudged(
                    member=group[0],
                    response_i=progress.response_i,
                    response_j=progress.response_j,
                    judge_index=progress.judge_index,
                )
            )
        )

    # ------------------------------------------------------------------ members in
    def _admit(
        self, request: pb.StreamGroupsRequest, ref: pb.MemberRef
    ) -> tuple[Submission, int] | None:
        """The member and its cost when it may be submitted, else its error is queued."""
        servicer = self._servicer
        sub = servicer.admission.member(request.member, self._principal)
        if isinstance(sub, Rejection):
            self._error(ref, servicer._rejected(sub))
            return None
        cost = self._bytes.cost(request)
        refusal = self._bytes.refusal(sub, cost)
        if refusal is not None:
            self._error(ref, servicer._rejected(refusal))
            return None
        return sub, cost

    async def _handle(self, request: Any) -> None:
        """One request → its events; nothing a member does can escape into the stream."""
        if is_undecodable(request):
            self._error(pb.MemberRef(), _undecodable_member(request))
            return
        ref = request.member.member
        try:
            admitted = self._admit(request, ref)
            if admitted is None:
                return
            sub, cost = admitted
            try:
                ticket = await self._servicer._submit(sub, self._on_progress_cb)
            except CallInterrupted as exc:
                self._error(ref, self._servicer._interrupted(sub, exc))
                return
            self._take(sub, ref, cost, ticket)
        except RecursionError:
            self._error(ref, _nested_too_deeply(ref))
        except Exception as exc:
            self._internal(ref, "handling a member", exc)

    def _take(self, sub: Submission, ref: pb.MemberRef, cost: int, ticket: Ticket) -> None:
        """Queue what a decided member gets: its error, a replay, or a held waiter."""
        if ticket.rejection is not None:
            self._error(ref, ticket.rejection)
            return
        durable = ticket.durable
        if ticket.replay is not None:
            if durable is not None and not durable.done():
                # The outcome is still being written: the stream must not end before
                # this member's answer, so it counts as held until then.
                self._replays_pending += 1
                durable.add_done_callback(lambda _: self._replay_when_durable(sub, ticket, ref))
            else:
                self._replay(sub, ticket, ref)
            return
        waiter = ticket.waiter
        assert waiter is not None
        self._hold(sub, cost)
        held = _Held(sub, ticket, ref, cost)
        self._held[waiter.future] = held
        waiter.future.add_done_callback(self._on_settled_cb)
        # "accepted" only once the member is in the store.
        if durable is not None and not durable.done():
            self._unaccepted += 1
            durable.add_done_callback(lambda _: self._accepted_when_durable(held))
        else:
            self._accepted(held)

    def _accepted_when_durable(self, held: _Held) -> None:
        self._unaccepted -= 1
        self._accepted(held)
        self._room_check()

    def _backlog(self) -> int:
        """Events queued or owed: members and replays waiting for the store owe one each."""
        return len(self._out) + self._unaccepted + self._replays_pending + len(self._deciding)

    def _decide(self, request: Any) -> None:
        """Start a member's decision; its events are queued when it is taken.

        Several at once, so that a stream over a shared store is not one round trip per
        member; tasks start in the order they are made, and a decision that needs no
        store read (a single process) completes in its first step, in that order.
        """
        task = asyncio.ensure_future(self._handle(request))
        self._deciding.add(task)
        task.add_done_callback(self._decided)

    def _decided(self, task: asyncio.Task[None]) -> None:
        self._deciding.discard(task)
        self._wake.set()
        self._room_check()

    def _room_check(self) -> None:
        if not self._room.is_set() and self._backlog() < self._limits.stream_max_buffered_events:
            self._room.set()

    def _replay_when_durable(self, sub: Submission, ticket: Ticket, ref: pb.MemberRef) -> None:
        self._replays_pending -= 1
        self._replay(sub, ticket, ref)
        self._wake.set()
        self._room_check()

    def _replay(self, sub: Submission, ticket: Ticket, ref: pb.MemberRef) -> None:
        failure = ticket.store_failure()
        if failure is not None:
            self._error(ref, self._servicer._interrupted(sub, failure))
            return
        self._push(pb.StreamGroupsResponse(accepted=pb.MemberAccepted(member=ref)))
        self._answer(ref, self._servicer._replay(sub, ticket))

    def _accepted(self, held: _Held) -> None:
        waiter = held.ticket.waiter
        assert waiter is not None
        if self._held.get(waiter.future) is not held:
            return  # the stream ended meanwhile
        failure = held.ticket.store_failure()
        if failure is None:
            self._push(pb.StreamGroupsResponse(accepted=pb.MemberAccepted(member=held.ref)))
            return
        del self._held[waiter.future]
        self._release(held)
        waiter.release()
        self._error(held.ref, self._servicer._interrupted(held.sub, failure))
        if not self._held and not self._reading:
            self._wake.set()

    def _hold(self, sub: Submission, cost: int) -> None:
        self._bytes.hold(cost)
        group = self._groups.get(sub.key)
        if group is None:
            self._groups[sub.key] = [convert.coords_to_proto(sub.coords), 1]
        else:
            group[1] += 1

    def _release(self, held: _Held) -> None:
        self._bytes.release(held.cost)
        group = self._groups.get(held.sub.key)
        if group is not None:
            group[1] -= 1
            if group[1] <= 0:
                del self._groups[held.sub.key]

    def _on_settled(self, future: asyncio.Future[Any]) -> None:
        held = self._held.pop(future, None)
        if held is None:  # released when the stream ended
            return
        self._release(held)
        waiter = held.ticket.waiter
        if waiter is not None:
            waiter.release()
        if future.cancelled():
            return
        error = future.exception()
        if isinstance(error, CallInterrupted):
            self._error(held.ref, self._servicer._interrupted(held.sub, error))
            if not self._held and not self._reading:
                self._wake.set()
            return
        try:
            answer = self._servicer._outcome_to_result(held.sub, held.ticket, future.result())
        except Exception as exc:
            self._internal(held.ref, "building a member's result", exc)
        else:
            self._answer(held.ref, answer)
        if not self._held and not self._reading:
            self._wake.set()  # possibly the last outcome: let the writer finish

    async def _read(self) -> None:
        limit = self._limits.stream_max_buffered_events
        try:
            async for request in self._requests:
                self._decide(request)
                # Stop reading while the client has not taken what it is owed (queued
                # events, and the events of members still being written): unread
                # requests stay in gRPC's flow-control window, and the client's writes
                # block once it is full.
                while self._backlog() >= limit:
                    self._room.clear()
                    await self._room.wait()
        finally:
            self._reading = False
            self._wake.set()

    async def run(self, write: Callable[[pb.StreamGroupsResponse], Awaitable[None]]) -> None:
        """Write events as the client takes them until every outcome is out (or it leaves)."""
        reader = asyncio.create_task(self._read())
        limit = self._limits.stream_max_buffered_events
        out = self._out
        try:
            while True:
                if out:
                    event = out.popleft()
                    if len(out) < limit and not self._room.is_set():
                        self._room.set()
                    await write(event)
                    continue
                if (
                    reader.done()
                    and not self._held
                    and not self._replays_pending
                    and not self._deciding
                ):
                    reader.result()  # re-raise a broken request stream
                    return
                self._wake.clear()
                await self._wake.wait()
        finally:
            # The client went away or the stream ended: drop our waiters only (the
            # members stay in their cohorts) and give back what this stream held.
            reader.cancel()
            deciding = list(self._deciding)
            for task in deciding:
                task.cancel()  # a decision already committed stands; no waiter is made
            await asyncio.gather(*deciding, return_exceptions=True)
            held, self._held = list(self._held.values()), {}
            for entry in held:
                self._release(entry)
                if entry.ticket.waiter is not None:
                    entry.ticket.waiter.release()
            await asyncio.gather(reader, return_exceptions=True)


def _nested_too_deeply(ref: pb.MemberRef) -> Rejection:
    """Nesting deep enough to exhaust the stack is malformed input, not a bug."""
    return Rejection(
        Reason.INVALID_MEMBER,
        "invalid member: nested too deeply to be processed",
        {"rolloutIndex": str(ref.rollout_index)},
        field_violations=(("candidate", "nested too deeply"),),
    )


def _undecodable_member(request: Any) -> Rejection:
    description = f"the request bytes are not a valid message: {request.error}"
    return Rejection(
        Reason.INVALID_MEMBER,
        f"invalid member: {description}",
        field_violations=(("request", description),),
    )
