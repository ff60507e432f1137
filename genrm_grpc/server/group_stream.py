"""One StreamGroups call of the CohortService: members read, events written back.

``GroupStream`` holds the stream's members until their outcomes, bounds what it holds
(``admission.py``'s stream limits) and applies backpressure both ways; the answers it
writes are made by ``CohortServicer`` (``server/servicer.py``), as for SubmitMember.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from genrm.cohort.v1 import cohort_pb2 as pb
from google.rpc import code_pb2, error_details_pb2, status_pb2

from genrm_grpc.cohort.model import (
    CohortKey,
    Reason,
    Rejection,
    Submission,
)
from genrm_grpc.runtime.live import (
    CallInterrupted,
    PairProgress,
    Ticket,
)
from genrm_grpc.server import convert
from genrm_grpc.server.errors import DOMAIN, status_proto
from genrm_grpc.server.interceptors import is_undecodable

if TYPE_CHECKING:
    from genrm_grpc.server.servicer import CohortServicer

log = logging.getLogger(__name__)


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


class GroupStream:
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
                ticket = await self._servicer.submit(sub, self._on_progress_cb)
            except CallInterrupted as exc:
                self._error(ref, self._servicer.interrupted(sub, exc))
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
            self._error(ref, self._servicer.interrupted(sub, failure))
            return
        self._push(pb.StreamGroupsResponse(accepted=pb.MemberAccepted(member=ref)))
        self._answer(ref, self._servicer.replay_answer(sub, ticket))

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
        self._error(held.ref, self._servicer.interrupted(held.sub, failure))
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
            self._error(held.ref, self._servicer.interrupted(held.sub, error))
            if not self._held and not self._reading:
                self._wake.set()
            return
        try:
            answer = self._servicer.outcome_answer(held.sub, held.ticket, future.result())
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
