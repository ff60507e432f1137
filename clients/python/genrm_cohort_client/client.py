"""``CohortClient``: the asyncio client collectors use (retries, group ids, attempts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

import grpc
import tenacity
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.protobuf import json_format

from genrm_cohort_client.errors import (
    SERVER_OVERLOADED,
    CohortConnectError,
    CohortError,
    ErrorDetails,
    status_error_info,
)
from genrm_cohort_client.ids import GroupAttempts, new_group_id
from genrm_cohort_client.options import ChannelOptions, RetryPolicy, checked_retry, make_channel
from genrm_cohort_client.stats import ClientStats, reason_key

__all__ = [
    "CandidateLike",
    "CohortClient",
    "MemberRefLike",
    "PromptLike",
    "Regenerate",
    "make_candidate",
    "make_member_ref",
    "make_prompt",
]

T = TypeVar("T")

log = logging.getLogger("genrm_cohort_client")
#: Jitter from a generator of its own, not the ``random`` module's shared one: a
#: process that seeds ``random`` for a reproducible run draws the same numbers
#: whether or not a call was retried.
_JITTER = random.Random()

PromptLike = pb.Prompt | str | Sequence[tuple[str, str]] | Sequence[Mapping[str, str]]
"""A ``Prompt``, a single user turn, ``(role, content)`` pairs or ``{"role", "content"}`` dicts."""
CandidateLike = pb.Candidate | str | Mapping[str, Any]
"""A ``Candidate``, an answer text, or a whole Responses-API object (sent as JSON)."""
MemberRefLike = pb.MemberRef | Mapping[str, Any]
"""A ``MemberRef`` or a plain mapping of its fields (``{"group_id": …, "rollout_index": …}``;
the JSON names ``groupId`` … work too)."""
Regenerate = Callable[[int], Awaitable[Sequence[CandidateLike]]]
"""Called with the new group attempt after ABORTED; returns the replacement answers."""

DEFAULT_TIMEOUT_S = 3600.0


def make_prompt(
    prompt: PromptLike, *, principle: str | None = None, baseline_response: str | None = None
) -> pb.Prompt:
    """Build a ``Prompt`` from any :data:`PromptLike` (a ``Prompt`` is copied as is)."""
    if isinstance(prompt, pb.Prompt):
        out = pb.Prompt()
        out.CopyFrom(prompt)
    elif isinstance(prompt, str):
        out = pb.Prompt(messages=[pb.ChatMessage(role="user", content=prompt)])
    else:
        messages = []
        for turn in prompt:
            if isinstance(turn, Mapping):
                messages.append(pb.ChatMessage(role=turn["role"], content=turn["content"]))
            else:
                role, content = turn
                messages.append(pb.ChatMessage(role=role, content=content))
        out = pb.Prompt(messages=messages)
    if principle is not None:
        out.principle = principle
    if baseline_response is not None:
        out.baseline_response = baseline_response
    return out


def make_member_ref(member: MemberRefLike) -> pb.MemberRef:
    """Build a ``MemberRef`` from any :data:`MemberRefLike` (a ``MemberRef`` as is).

    An unknown field or a value of the wrong type raises ``ValueError`` naming it.
    """
    if isinstance(member, pb.MemberRef):
        return member
    if not isinstance(member, Mapping):
        raise TypeError(f"member must be a MemberRef or a mapping, not {type(member).__name__}")
    try:
        return json_format.ParseDict(dict(member), pb.MemberRef())
    except json_format.ParseError as exc:
        raise ValueError(f"invalid member: {exc}".replace("\n", " ")) from None


def make_candidate(candidate: CandidateLike) -> pb.Candidate:
    """Build a ``Candidate``: a text becomes ``output_text``, a dict ``responses_api_json``."""
    if isinstance(candidate, pb.Candidate):
        return candidate
    if isinstance(candidate, str):
        return pb.Candidate(output_text=candidate)
    return pb.Candidate(responses_api_json=json.dumps(dict(candidate), ensure_ascii=False))


#: Metadata key carrying a SubmitMember's ``group_id`` (for group-affine load balancing).
GROUP_ID_METADATA = "x-genrm-group-id"
#: Metadata key naming the server process that answers (docs/protocol.md): in the
#: trailers of every call, and in the initial metadata of a call before it waits.
SERVER_INSTANCE_METADATA = "x-genrm-server-instance"


def _trailers(exc: grpc.RpcError) -> Any:
    """A failed call's trailing metadata (None for an error raised without a call)."""
    trailing = getattr(exc, "trailing_metadata", None)
    return trailing() if callable(trailing) else None


#: The unary RPCs, called as unary-stream on the same method (identical on the wire): a
#: unary-unary call of grpc.aio sees the initial metadata only with the answer, so a
#: member waiting for its cohort would learn the server instance only at the end.
_UNARY_RPCS: dict[str, tuple[Any, Any]] = {
    "SubmitMember": (pb.SubmitMemberRequest, pb.SubmitMemberResponse),
    "Compare": (pb.CompareRequest, pb.CompareResponse),
    "GetCohort": (pb.GetCohortRequest, pb.GetCohortResponse),
}


def _early_metadata_calls(channel: grpc.aio.Channel) -> dict[str, Any]:
    return {
        name: channel.unary_stream(
            f"/genrm.cohort.v1.CohortService/{name}",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        for name, (request, response) in _UNARY_RPCS.items()
    }


class _Call:
    """One logical call across its resends: what it is, since when it retries."""

    __slots__ = (
        "calls",
        "describe",
        "first_failure",
        "instance",
        "last_error",
        "last_warned",
        "retries",
        "started",
    )

    def __init__(self, describe: Callable[[], str], started: float) -> None:
        self.describe = describe
        self.started = started
        self.calls = 0
        self.retries = 0
        self.first_failure: float | None = None
        self.last_warned = started
        self.last_error: CohortError | None = None
        self.instance: str | None = None


def _members(indices: Iterable[int]) -> str:
    shown = sorted(indices)
    return ",".join(map(str, shown[:16])) + (f",… ({len(shown)} in all)" if len(shown) > 16 else "")


def _describe_ref(method: str, ref: pb.MemberRef) -> str:
    if ref.HasField("group_id"):
        where = f"group_id={ref.group_id!r} group_attempt={ref.group_attempt}"
    else:
        where = f"task_index={ref.task_index}"
    return f"{method} {where} rollout_index={ref.rollout_index}"


class _Done:
    pass


_DONE = _Done()


class CohortClient:
    """Asyncio client of ``genrm.cohort.v1.CohortService``, one channel per client.

    Every method raises :class:`CohortError` (status code, ErrorInfo reason, metadata)
    and retries ``UNAVAILABLE`` per ``retry`` (a :class:`RetryPolicy`); ``timeout`` is
    the deadline of *one* call (default ``default_timeout_s``), so the total time of a
    retried call is bounded by ``RetryPolicy.max_attempts`` / ``max_elapsed_s``. The
    client must be created and used on one event loop (use :class:`SyncCohortClient`
    from synchronous code). ``stats`` (:class:`ClientStats`) counts its retries per
    reason, server instance changes and connect failures.

    ``SubmitMember``, ``Compare`` and ``GetCohort`` go out as unary-stream calls of
    the same methods (the same bytes on the wire), so that the server's initial
    metadata is seen while a call waits; a ``channel`` given with client interceptors
    therefore sees them as unary-stream calls. ``self.stub`` is the plain stub.
    """

    def __init__(
        self,
        target: str,
        *,
        options: ChannelOptions | None = None,
        retry: RetryPolicy | None = None,
        default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.target = target
        self.options = options or ChannelOptions()
        self.retry = checked_retry(retry) or RetryPolicy()
        self.default_timeout_s = default_timeout_s
        self._channel = channel if channel is not None else make_channel(target, self.options)
        self._metadata = self.options.call_metadata() or None
        self.stub = pb_grpc.CohortServiceStub(self._channel)
        self._unary_calls = _early_metadata_calls(self._channel)
        self.attempts = GroupAttempts()
        #: Retries per reason, server instance changes, connect failures (ClientStats).
        self.stats = ClientStats()
        self._clock: Callable[[], float] = time.monotonic  # a seam for tests
        self._connected = False
        self._connect_lock: asyncio.Lock | None = None
        self._connect_failures = 0
        self._connect_error: CohortConnectError | None = None
        self._connect_error_at = 0.0
        self._closing = False
        self._closed = asyncio.Event()
        self._retrying_now = 0

    async def __aenter__(self) -> CohortClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closing = True  # calls it ends come back CANCELLED: never resend those
        self._closed.set()  # calls waiting for a lost server give up
        await self._channel.close(None)

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channel

    async def connect(self, timeout: float | None = None) -> None:
        """Wait for the first connection to the server.

        ``timeout`` defaults to ``ChannelOptions.connect_timeout_s`` (``None`` there:
        no limit). Raises :class:`CohortConnectError` when nothing answers in time. Every
        call does this implicitly until the client has connected once; calling it first
        lets a program say "connecting…" and fail early. Concurrent callers share one
        attempt: when it fails, all of them get the error at once. A failure is
        remembered for ``ChannelOptions.connect_failure_ttl_s``: until then calls (and
        ``connect()`` without ``timeout``) raise it at once instead of waiting again; an
        explicit ``timeout`` always makes a new attempt.
        """
        if self._connected:
            return
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        if timeout is None:
            self._raise_remembered_connect_error()
        failures = self._connect_failures
        async with self._connect_lock:
            if self._connected:
                return
            if self._connect_failures != failures and self._connect_error is not None:
                # The attempt this caller queued behind failed.
                raise self._connect_error.again(None)
            limit = self.options.connect_timeout_s if timeout is None else timeout
            try:
                await self._wait_connected(limit)
            except CohortConnectError as exc:
                self._connect_failures += 1
                self.stats.connect_failures += 1
                self._connect_error = exc
                self._connect_error_at = self._clock()
                raise
            self._connected = True
            self._connect_error = None

    def _raise_remembered_connect_error(self) -> None:
        error, ttl = self._connect_error, self.options.connect_failure_ttl_s
        if error is None or ttl <= 0:
            return
        age = self._clock() - self._connect_error_at
        if age < ttl:
            self.stats.connect_failures_cached += 1
            raise error.again(age)

    async def _wait_connected(self, limit: float | None) -> None:
        if self._channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return
        if limit is None:
            await self._channel.channel_ready()
            return
        try:
            async with asyncio.timeout(limit):
                await self._channel.channel_ready()
        except TimeoutError:
            cause = await self._connect_failure_cause()
            if cause is not None:
                raise CohortConnectError(self.target, limit, cause) from None

    async def _connect_failure_cause(self) -> str | None:
        """Why the channel is not connected (gRPC's own words), or None if it now is.

        One call that does not wait for a connection fails at once with the transport's
        last error; any answer from a server (even UNIMPLEMENTED) means it is reachable.
        """
        probe = self._channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            await probe(b"", timeout=1.0, wait_for_ready=False, metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "no answer from the address (the connection attempt is still pending)"
            if code == grpc.StatusCode.UNAVAILABLE:
                return exc.details() or "unavailable"
        return None

    # -- plumbing --------------------------------------------------------------------

    def _timeout(self, timeout: float | None) -> float | None:
        return self.default_timeout_s if timeout is None else timeout

    def _call_kwargs(self, timeout: float | None, group_id: str | None = None) -> dict[str, Any]:
        metadata = self._metadata
        if group_id is not None:
            # Group affinity (docs/scaling.md): a load balancer may hash on it so that a
            # group's members meet on one replica; correctness never depends on it.
            metadata = (*(metadata or ()), (GROUP_ID_METADATA, group_id))
        return {
            "timeout": self._timeout(timeout),
            "metadata": metadata,
            "wait_for_ready": self.options.wait_for_ready,
        }

    def _retryable(self, policy: RetryPolicy, exc: BaseException) -> bool:
        if not isinstance(exc, CohortError) or isinstance(exc, CohortConnectError):
            return False  # a connect failure already waited its connect deadline
        if exc.code == grpc.StatusCode.UNAVAILABLE or exc.reason == SERVER_OVERLOADED:
            return True  # SERVER_OVERLOADED: a server's RPC limits, whatever the code
        if exc.code == grpc.StatusCode.CANCELLED:
            # Not the caller: its cancellation ends the awaiting task and never gets
            # here. A CANCELLED status without ErrorInfo comes from the other side, e.g.
            # grpc-core refusing a call beyond its pending-call queue; resending the
            # same member is safe (it attaches or replays). Not after close().
            return not exc.reason and not self._closing
        return (
            exc.code == grpc.StatusCode.DEADLINE_EXCEEDED
            and policy.retry_deadline_exceeded
            and not exc.reason
        )

    def _retry_budget_left(self, policy: RetryPolicy, state: _Call) -> float:
        """Seconds this call may still spend retrying (``max_elapsed_s``)."""
        if policy.max_elapsed_s is None:
            return math.inf
        if state.first_failure is None:
            return policy.max_elapsed_s
        return policy.max_elapsed_s - (self._clock() - state.first_failure)

    def _retrying(self, policy: RetryPolicy, state: _Call) -> tenacity.AsyncRetrying:
        def after(retry_state: tenacity.RetryCallState) -> None:
            # After a retryable failure, before stop and wait are decided.
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            if isinstance(exc, CohortError):
                state.last_error = exc
            if state.first_failure is None:
                state.first_failure = self._clock()

        def stop(retry_state: tenacity.RetryCallState) -> bool:
            return (
                state.calls >= policy.max_attempts
                or self._retry_budget_left(policy, state) <= 0
                or self._closing
            )

        def wait(retry_state: tenacity.RetryCallState) -> float:
            backoff = policy.initial_backoff_s * 2.0 ** min(state.retries, 64)
            sleep = min(policy.max_backoff_s, backoff) + _JITTER.uniform(0, policy.jitter_s)
            return max(0.0, min(sleep, self._retry_budget_left(policy, state)))

        def before_sleep(retry_state: tenacity.RetryCallState) -> None:
            error = state.last_error
            sleep = retry_state.next_action.sleep if retry_state.next_action else 0.0
            state.retries += 1
            if state.retries == 1:
                self.stats.retried_calls += 1
                self._retrying_now += 1
            if error is not None:
                self.stats.count_retry(reason_key(error.code.name, error.reason))
                first = state.retries == 1
                if first or self._clock() - state.last_warned >= policy.warn_every_s:
                    self._warn(policy, state, "resending" if first else "still retrying")
            if policy.on_retry is not None and error is not None:
                policy.on_retry(error, state.calls, float(sleep))

        return tenacity.AsyncRetrying(
            stop=stop,
            wait=wait,
            retry=tenacity.retry_if_exception(lambda e: self._retryable(policy, e)),
            after=after,
            before_sleep=before_sleep,
            reraise=True,
        )

    def _warn(self, policy: RetryPolicy, state: _Call, doing: str) -> None:
        """One WARNING about a retrying call: what, why, how long so far, until when."""
        error = state.last_error
        now = self._clock()
        state.last_warned = now
        retrying = 0.0 if state.first_failure is None else now - state.first_failure
        why = "?" if error is None else reason_key(error.code.name, error.reason)
        limit = (
            "no time limit"
            if policy.max_elapsed_s is None
            else f"gives up after {policy.max_elapsed_s:g} s of retrying"
        )
        log.warning(
            "%s to %s: %s after %s (%s): retry %d, retrying for %.1f s, %.1f s since the "
            "call started; %s, at most %d calls",
            state.describe(),
            self.target,
            doing,
            why,
            "" if error is None else error.message,
            state.retries,
            retrying,
            now - state.started,
            limit,
            policy.max_attempts,
            extra={
                "call": state.describe(),
                "target": self.target,
                "code": "" if error is None else error.code.name,
                "reason": "" if error is None else error.reason,
                "retries": state.retries,
                "retrying_s": round(retrying, 3),
                "elapsed_s": round(now - state.started, 3),
                "server_instance": state.instance or "",
            },
        )

    async def _await_server(self, policy: RetryPolicy, state: _Call) -> None:
        """Before a resend: wait for the channel to be ready, within the retry budget.

        With ``wait_for_ready`` a resent call would otherwise wait for a lost server on
        its own, silently and up to its whole deadline. Here it waits in the open: a
        WARNING every ``warn_every_s`` and the last error once ``max_elapsed_s`` of
        retrying is spent (or the client closes).
        """
        if not self.options.wait_for_ready:
            return  # calls fail fast while the server is away; backoff paces them
        assert state.last_error is not None
        while True:
            connectivity = self._channel.get_state(try_to_connect=True)
            if connectivity == grpc.ChannelConnectivity.READY:
                return
            left = self._retry_budget_left(policy, state)
            if self._closing or left <= 0 or connectivity == grpc.ChannelConnectivity.SHUTDOWN:
                raise state.last_error
            due = state.last_warned + policy.warn_every_s - self._clock()
            if due <= 0:
                self._warn(policy, state, "waiting for the server to come back")
                due = policy.warn_every_s
            changed = asyncio.ensure_future(self._channel.wait_for_state_change(connectivity))
            closed = asyncio.ensure_future(self._closed.wait())
            try:
                await asyncio.wait(
                    {changed, closed}, timeout=min(due, left), return_when="FIRST_COMPLETED"
                )
            finally:
                for waiter in (changed, closed):
                    waiter.cancel()
                await asyncio.gather(changed, closed, return_exceptions=True)

    def _note_instance(self, metadata: Any, state: _Call | None) -> None:
        """Remember the server instance an answer came from; say when it changed."""
        seen = next((str(v) for k, v in (metadata or ()) if k == SERVER_INSTANCE_METADATA), None)
        if not seen:
            return
        if state is not None:
            state.instance = seen
        known = self.stats.server_instance
        if known == seen:
            return
        self.stats.server_instance = seen
        if known is None:
            log.debug("%s: answered by server instance %s", self.target, seen)
            return
        self.stats.server_instance_changes += 1
        waiting = self._retrying_now
        level = (
            logging.WARNING if waiting or (state is not None and state.retries) else logging.INFO
        )
        log.log(
            level,
            "the server at %s is another process now (instance %s, was %s), noticed by %s; "
            "%d call(s) of this client are retrying: a restarted server with the same store "
            "reattaches resent members, any other server on this address starts new cohorts "
            "for them (which wait for members that may never come)",
            self.target,
            seen,
            known,
            "a call" if state is None else state.describe(),
            waiting,
            extra={
                "target": self.target,
                "server_instance": seen,
                "previous_server_instance": known,
                "call": "" if state is None else state.describe(),
                "retrying_calls": waiting,
            },
        )

    async def _with_retry(
        self,
        policy: RetryPolicy | None,
        call: Callable[[_Call], Awaitable[T]],
        describe: Callable[[], str],
    ) -> T:
        policy = checked_retry(policy) or self.retry
        state = _Call(describe, self._clock())
        try:
            async for attempt in self._retrying(policy, state):
                with attempt:
                    if state.retries:
                        await self._await_server(policy, state)
                    state.calls += 1
                    return await call(state)
        except CohortError as exc:
            exc.attempts = max(state.calls, 1)
            if state.retries and self._retryable(policy, exc) and not self._closing:
                self.stats.gave_up += 1
                self._warn(policy, state, f"giving up after {state.calls} calls")
            raise
        finally:
            if state.retries:
                self._retrying_now -= 1
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    async def _unary(
        self, method: str, request: Any, timeout: float | None, state: _Call | None, **ctx: Any
    ) -> Any:
        await self.connect()
        call = self._unary_calls[method](request, **self._call_kwargs(timeout, ctx.get("group_id")))
        try:
            # Sent before the server waits (members, a judge): known while the call still
            # waits for its answer; a call answered at once carries it in its trailers.
            self._note_instance(await call.initial_metadata(), state)
            answers = [response async for response in call]
            self._note_instance(await call.trailing_metadata(), state)
            if len(answers) != 1:
                details = f"{method} answered {len(answers)} messages instead of one"
                raise CohortError(
                    ErrorDetails(code=grpc.StatusCode.INTERNAL, message=details), **ctx
                )
            return answers[0]
        except grpc.RpcError as exc:
            self._note_instance(_trailers(exc), state)
            raise CohortError.from_rpc_error(exc, **ctx) from None
        except asyncio.CancelledError:
            call.cancel()
            raise

    # -- unary RPCs ------------------------------------------------------------------

    async def submit_member(
        self,
        member: MemberRefLike,
        prompt: PromptLike,
        candidate: CandidateLike,
        *,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> pb.MemberResult:
        """``SubmitMember``: waits for the cohort's outcome; resends on UNAVAILABLE.

        ``member`` is a ``MemberRef`` or a mapping such as ``{"group_id": "job-1/p-3",
        "group_attempt": 0, "rollout_index": 2, "group_size": 8}``.
        """
        member = make_member_ref(member)
        request = pb.SubmitMemberRequest(
            member=member, prompt=make_prompt(prompt), candidate=make_candidate(candidate)
        )
        ctx: dict[str, Any] = {}
        if member.HasField("group_id"):
            ctx = {"group_id": member.group_id, "group_attempt": member.group_attempt}
            self.attempts.record(member.group_id, member.group_attempt)

        async def once(state: _Call) -> pb.MemberResult:
            response = await self._unary("SubmitMember", request, timeout, state, **ctx)
            result: pb.MemberResult = response.result
            return result

        return await self._with_retry(retry, once, lambda: _describe_ref("SubmitMember", member))

    async def compare(
        self,
        prompt: PromptLike,
        candidates: Iterable[CandidateLike],
        *,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> pb.CompareResponse:
        """``Compare`` (stateless); a judge failure is UNAVAILABLE/JUDGE_FAILED, retried."""
        request = pb.CompareRequest(
            prompt=make_prompt(prompt), candidates=[make_candidate(c) for c in candidates]
        )

        async def once(state: _Call) -> pb.CompareResponse:
            response: pb.CompareResponse = await self._unary("Compare", request, timeout, state)
            return response

        what = f"Compare of {len(request.candidates)} candidates"
        return await self._with_retry(retry, once, lambda: what)

    async def get_cohort(
        self,
        member: MemberRefLike | str,
        *,
        attempt: int | None = None,
        prompt: PromptLike | None = None,
        timeout: float | None = 30.0,
        retry: RetryPolicy | None = None,
    ) -> pb.CohortInfo:
        """``GetCohort`` by ``MemberRef`` or group id (no ``attempt``: the newest one)."""
        if isinstance(member, str):
            ref = pb.MemberRef(group_id=member)
            if attempt is not None:
                ref.group_attempt = attempt
        else:
            ref = make_member_ref(member)
        request = pb.GetCohortRequest(member=ref)
        if prompt is not None:
            request.prompt.CopyFrom(make_prompt(prompt))

        async def once(state: _Call) -> pb.CohortInfo:
            response = await self._unary("GetCohort", request, timeout, state)
            info: pb.CohortInfo = response.cohort
            return info

        what = f"GetCohort group_id={ref.group_id!r}"
        return await self._with_retry(retry, once, lambda: what)

    # -- streams ---------------------------------------------------------------------

    async def stream_groups(
        self,
        requests: AsyncIterable[pb.SubmitMemberRequest] | Iterable[pb.SubmitMemberRequest],
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[pb.StreamGroupsResponse]:
        """Raw ``StreamGroups``: yields every event; no retries (see ``evaluate_group``)."""

        async def wrap() -> AsyncIterator[pb.StreamGroupsRequest]:
            if isinstance(requests, AsyncIterable):
                async for item in requests:
                    yield pb.StreamGroupsRequest(member=item)
            else:
                for item in requests:
                    yield pb.StreamGroupsRequest(member=item)

        await self.connect()
        call = self.stub.StreamGroups(wrap(), **self._call_kwargs(timeout))
        try:
            async for event in call:
                yield event
        except grpc.RpcError as exc:
            raise CohortError.from_rpc_error(exc) from None
        finally:
            call.cancel()

    async def evaluate_group(
        self,
        prompt: PromptLike,
        candidates: Sequence[CandidateLike],
        *,
        group_id: str | None = None,
        attempt: int | None = None,
        group_size: int | None = None,
        rollout_indices: Sequence[int] | None = None,
        task_index: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        max_group_attempts: int = 1,
        regenerate: Regenerate | None = None,
        reuse_answers_on_abort: bool = False,
        on_event: Callable[[pb.StreamGroupsResponse], None] | None = None,
    ) -> AsyncGenerator[pb.MemberResult, None]:
        """Submit a group on ``StreamGroups`` and yield each member's result as it arrives.

        ``candidates[k]`` fills slot ``rollout_indices[k]`` (default ``k``); the group size
        defaults to the number of candidates. ``group_id`` defaults to a freshly minted
        time-ordered id; ``attempt`` defaults to the newest attempt this client used for
        the group (0 for a new one), so calling again resends the same attempt, which
        reattaches or replays and never costs a second judge call.

        Members that fail with ``UNAVAILABLE`` (or whose stream breaks) are resent
        identically on a new stream per ``retry``. ``ABORTED`` means the group attempt
        failed: when ``max_group_attempts`` > 1 *and* the caller opted in (``regenerate``
        returns fresh answers for the new attempt — for the same slots, or for every slot
        of the group — or ``reuse_answers_on_abort`` resends the same ones), the group is
        resubmitted as attempt + 1. Otherwise, and
        for every non-retryable status, a :class:`CohortError` is raised.
        ``on_event`` sees every raw stream event (acceptances, ``pair_judged`` progress).
        """
        if max_group_attempts < 1:
            raise ValueError("max_group_attempts must be >= 1")
        answers = [make_candidate(c) for c in candidates]
        indices = list(range(len(answers))) if rollout_indices is None else list(rollout_indices)
        if len(indices) != len(answers) or len(set(indices)) != len(indices):
            raise ValueError("rollout_indices must be distinct, one per candidate")
        if not answers:
            raise ValueError("a group needs at least one candidate")
        size = len(answers) if group_size is None else group_size
        gid = group_id if group_id is not None else new_group_id()
        current = self.attempts.current(gid) if attempt is None else attempt
        base_prompt = make_prompt(prompt)
        queue: asyncio.Queue[pb.MemberResult | _Done | BaseException] = asyncio.Queue()

        async def worker() -> None:
            nonlocal answers, current, indices
            try:
                for group_try in range(max_group_attempts):
                    self.attempts.record(gid, current)
                    members = {
                        idx: pb.SubmitMemberRequest(
                            member=self._ref(gid, current, idx, size, task_index),
                            prompt=base_prompt,
                            candidate=answer,
                        )
                        for idx, answer in zip(indices, answers, strict=True)
                    }
                    try:
                        await self._evaluate_attempt(
                            gid, current, members, timeout, retry, on_event, queue.put_nowait
                        )
                        break
                    except CohortError as exc:
                        opted_in = regenerate is not None or reuse_answers_on_abort
                        if (
                            exc.code != grpc.StatusCode.ABORTED
                            or not opted_in
                            or group_try + 1 >= max_group_attempts
                        ):
                            raise
                    current = max(current + 1, self.attempts.next(gid))
                    if regenerate is not None:
                        answers = [make_candidate(c) for c in await regenerate(current)]
                        if len(answers) == size and len(indices) != size:
                            indices = list(range(size))  # a whole replacement group
                        elif len(answers) != len(indices):
                            raise ValueError(
                                f"regenerate returned {len(answers)} answers for "
                                f"{len(indices)} slots (or {size} for the whole group)"
                            )
                queue.put_nowait(_DONE)
            except BaseException as exc:  # delivered to the consumer, re-raised there
                queue.put_nowait(exc)
                if not isinstance(exc, Exception):
                    raise

        task = asyncio.create_task(worker())
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Done):
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def evaluate_group_all(
        self, prompt: PromptLike, candidates: Sequence[CandidateLike], **kwargs: Any
    ) -> list[pb.MemberResult]:
        """:meth:`evaluate_group`, collected and ordered by rollout index."""
        results = [r async for r in self.evaluate_group(prompt, candidates, **kwargs)]
        return sorted(results, key=lambda r: r.member.rollout_index)

    @staticmethod
    def _ref(
        group_id: str, attempt: int, index: int, size: int, task_index: int | None
    ) -> pb.MemberRef:
        ref = pb.MemberRef(
            group_id=group_id, group_attempt=attempt, rollout_index=index, group_size=size
        )
        if task_index is not None:
            ref.task_index = task_index
        return ref

    async def _evaluate_attempt(
        self,
        group_id: str,
        attempt: int,
        members: dict[int, pb.SubmitMemberRequest],
        timeout: float | None,
        retry: RetryPolicy | None,
        on_event: Callable[[pb.StreamGroupsResponse], None] | None,
        emit: Callable[[pb.MemberResult], None],
    ) -> None:
        pending = dict(members)

        async def one_stream(state: _Call) -> None:
            await self._stream_round(
                group_id,
                attempt,
                pending,
                timeout,
                checked_retry(retry) or self.retry,
                on_event,
                emit,
                state,
            )

        def describe() -> str:
            where = f"group_id={group_id!r} group_attempt={attempt}"
            return f"StreamGroups {where} rollout_index={_members(pending)}"

        await self._with_retry(retry, one_stream, describe)

    async def _stream_round(
        self,
        group_id: str,
        attempt: int,
        pending: dict[int, pb.SubmitMemberRequest],
        timeout: float | None,
        policy: RetryPolicy,
        on_event: Callable[[pb.StreamGroupsResponse], None] | None,
        emit: Callable[[pb.MemberResult], None],
        state: _Call | None = None,
    ) -> None:
        """One stream carrying every pending member; results leave ``pending``."""
        ctx: dict[str, Any] = {"group_id": group_id, "group_attempt": attempt}
        await self.connect()
        requests = [pb.StreamGroupsRequest(member=m) for m in pending.values()]
        call = self.stub.StreamGroups(iter(requests), **self._call_kwargs(timeout))
        retry_later: ErrorDetails | None = None
        try:
            self._note_instance(await call.initial_metadata(), state)
            async for event in call:
                if on_event is not None:
                    on_event(event)
                kind = event.WhichOneof("event")
                if kind == "result":
                    index = event.result.member.rollout_index
                    if pending.pop(index, None) is not None:
                        emit(event.result)
                elif kind == "error":
                    details = status_error_info(event.error.status)
                    error = CohortError(details, **ctx)
                    if not self._retryable(policy, error):
                        raise error
                    retry_later = details
        except grpc.RpcError as exc:
            raise CohortError.from_rpc_error(exc, **ctx) from None
        finally:
            call.cancel()
        if pending:
            details = retry_later or ErrorDetails(
                code=grpc.StatusCode.UNAVAILABLE,
                message=f"stream ended without outcomes for members {sorted(pending)}",
            )
            raise CohortError(details, **ctx)
