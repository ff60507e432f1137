"""The judge client's HTTP side: one request to one endpoint, hedged onto another.

``Transport`` owns the aiohttp ``ClientSession`` (created on first use, inside the
running loop; a keep-alive ``TCPConnector`` of ``judge.max_connections``), turns an
endpoint's user-info into HTTP Basic authentication, sends a body and reads the whole
answer (capped at ``judge.max_response_bytes``; server-sent events are reassembled by
``judge/sse.py``), and tells the farm and the reachability listener what happened.
It decides nothing about retries: a failure comes back as ``AttemptFailed`` for
``judge/client.py`` to weigh.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from genrm_grpc.judge.attempts import RETRYABLE_STATUSES, AttemptFailed
from genrm_grpc.judge.budget import TokenLedger
from genrm_grpc.judge.farm import Endpoint, Farm
from genrm_grpc.judge.redact import Redactor, split_userinfo
from genrm_grpc.judge.sse import SSEAnswer, StreamError, StreamTooLarge
from genrm_grpc.judge.texts import describe, failure_class
from genrm_grpc.judge.types import JudgeProgress, ReachabilityListener
from genrm_grpc.judge.views import JudgeView
from genrm_grpc.judge.wire import judge_base_url, judge_endpoint

logger = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
"""The chunk size a body is read in."""


@dataclass(frozen=True)
class Reply:
    """One HTTP answer as read: its status, its body (or streamed answer) and endpoint."""

    status: int
    body: bytes
    retry_after: str | None
    endpoint: Endpoint | None = None
    #: A streamed answer, reassembled into the object a non-streamed answer decodes to.
    streamed: Any = None
    #: Bytes of the streamed answer's text (what is offloaded past ``offload_bytes``).
    streamed_bytes: int = 0


@dataclass(frozen=True)
class _Wire:
    """Where and how one endpoint is called (user-info turned into a header)."""

    post_url: str
    base_url: str
    headers: dict[str, str] | None


class Transport:
    """HTTP requests to the farm's endpoints for one ``JudgeClient``.

    ``connect_retries`` connection attempts are retried at once before a request
    fails; bodies (or streamed events) of ``offload_bytes`` or more are decoded on
    ``executor``; ``on_hedge`` is called for every hedged request.
    """

    def __init__(
        self,
        config: JudgeView,
        farm: Farm,
        tokens: TokenLedger,
        redact: Redactor,
        *,
        reachability: ReachabilityListener,
        on_hedge: Callable[[], None],
        connect_retries: int,
        offload_bytes: int,
        executor: concurrent.futures.Executor | None,
    ) -> None:
        self._config = config
        self._farm = farm
        self._tokens = tokens
        self._redact = redact
        self._reachability = reachability
        self._on_hedge = on_hedge
        self._connect_retries = connect_retries
        self._offload_bytes = offload_bytes
        self._executor = executor
        self._wires: dict[str, _Wire] = {}
        headers = {"Content-Type": "application/json"}
        self._api_key = config.judge.api_key()
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None

    def _wire(self, endpoint: Endpoint) -> _Wire:
        wire = self._wires.get(endpoint.url)
        if wire is None:
            url = endpoint.url
            headers = None
            _, user, password = split_userinfo(url)
            if not self._api_key and user is not None:
                token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
                headers = {"Authorization": f"Basic {token}"}
            wire = _Wire(judge_endpoint(url, self._config.judge.api), judge_base_url(url), headers)
            self._wires[url] = wire
        return wire

    def unreachable(self, endpoint: Endpoint | None, detail: str) -> None:
        """Readiness hears "unreachable" once no endpoint of the farm answers."""
        if endpoint is not None:
            endpoint.reachable = False
        if not any(e.reachable and e.takes_work for e in self._farm.endpoints):
            self._reachability.judge_unreachable(detail)

    def reached(self, endpoint: Endpoint | None) -> None:
        if endpoint is not None:
            endpoint.reachable = True
        self._reachability.judge_reachable()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._config.judge.max_connections,
                limit_per_host=0,
                # Deadlines are ours (asyncio.timeout per attempt), not aiohttp's.
                ttl_dns_cache=60,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                headers=self._headers,
                auto_decompress=True,
                raise_for_status=False,
            )
        return self._session

    async def get(
        self, endpoint: Endpoint, path: str, timeout_s: float, *, limit: int = READ_CHUNK
    ) -> tuple[int | str, bytes]:
        """``GET`` a path of the endpoint: (status, first ``limit`` bytes), or (why, b"")."""
        wire = self._wire(endpoint)
        try:
            async with asyncio.timeout(timeout_s):
                async with self._http().get(wire.base_url + path, headers=wire.headers) as r:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in r.content.iter_chunked(READ_CHUNK):
                        chunks.append(chunk)
                        size += len(chunk)
                        if size >= limit:
                            break
                    return r.status, b"".join(chunks)[:limit]
        except TimeoutError:
            return f"no answer within {timeout_s:g}s", b""
        except (aiohttp.ClientError, OSError) as exc:
            return self._redact(describe(exc)), b""

    # -- one attempt, maybe hedged ----------------------------------------------------------

    async def send(
        self,
        body: bytes,
        attempt_no: int,
        primary: Endpoint,
        key: str | None,
        tried: list[Endpoint],
        progress: JudgeProgress | None = None,
    ) -> Reply:
        """POST once to ``primary``; hedged on another endpoint after its hedge point.

        The hedge point is ``judge_hedge_after_s`` or, in a farm, a high quantile of the
        endpoint's latencies (``Farm.hedge_after``). A request that the hedge beats
        counts against its endpoint's health ("slow"): a node that accepts and never
        answers is ejected after a few of them.
        """
        hedge_after = self._farm.hedge_after(primary)
        if hedge_after is None:
            return await self.post(body, attempt_no, primary, progress)
        first: asyncio.Future[Reply] = asyncio.ensure_future(
            self.post(body, attempt_no, primary, progress)
        )
        tasks = [first]
        extra: Endpoint | None = None
        try:
            done, _ = await asyncio.wait(tasks, timeout=hedge_after)
            if done:
                return first.result()
            extra = await self._hedge_slot(first, key, [primary, *tried])
            if extra is None:
                return first.result()
            extra.hedges += 1
            self._on_hedge()
            logger.debug(
                "judge attempt %d hedged after %.3gs on %s",
                attempt_no,
                hedge_after,
                extra.display,
            )
            second = asyncio.ensure_future(self.post(body, attempt_no, extra, progress))
            tasks.append(second)
            return await self._first_answer(first, second, primary, extra, hedge_after)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if extra is not None:
                self._farm.release(extra)

    async def _hedge_slot(
        self, first: asyncio.Future[Reply], key: str | None, avoid: list[Endpoint]
    ) -> Endpoint | None:
        """A taken slot on another endpoint for the hedge, or None if ``first`` answered
        while every other endpoint was full."""
        extra = self._farm.pick(key, avoid)
        if extra is not None:
            self._farm.take(extra)
            return extra
        # Every other endpoint is full: the hedge takes the first slot that frees (a
        # farm at saturation must still get a hung request answered).
        room = asyncio.ensure_future(self._farm.acquire(key, avoid))
        racing: list[asyncio.Future[Any]] = [first, room]
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        if first.done():
            room.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                got = await room
                self._farm.release(got)  # acquired as it was cancelled
            return None
        return room.result()

    async def _first_answer(
        self,
        first: asyncio.Future[Reply],
        second: asyncio.Future[Reply],
        primary: Endpoint,
        extra: Endpoint,
        hedge_after: float,
    ) -> Reply:
        """The first of the two requests to answer; the last failure if both fail."""
        pending: set[asyncio.Future[Reply]] = {first, second}
        failure: BaseException | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                error = task.exception()
                if error is None:
                    if task is second and extra is not primary and not first.done():
                        self._farm.failed(
                            primary,
                            "slow",
                            f"no answer within the hedge point {hedge_after:.3g}s",
                        )
                    return task.result()
                failure = error
        assert failure is not None
        raise failure

    # -- one request ------------------------------------------------------------------------

    async def post(
        self,
        body: bytes,
        attempt_no: int,
        endpoint: Endpoint,
        progress: JudgeProgress | None = None,
    ) -> Reply:
        """One HTTP request; the whole body is read, up to ``max_response_bytes``.

        What happened is reported to the farm: a 2xx answer's latency, a 5xx or a
        transport failure against the endpoint's health. With ``judge.stream``, no
        first generated token within ``judge.first_token_timeout_s`` (counted from the
        send, connection retries included) closes the connection and counts against
        the endpoint like a request timeout (kind ``first_token``).
        """
        judge = self._config.judge
        first_token_s = judge.first_token_timeout_s if judge.stream else None
        started = time.perf_counter()
        first_token = asyncio.timeout(first_token_s)
        try:
            async with first_token:
                reply = await self._exchange(body, attempt_no, endpoint, progress, first_token)
        except TimeoutError:
            # Only the first-token timer ends here (``_exchange`` turns every other
            # OSError into a transport failure); the connection is already closed.
            assert first_token_s is not None
            detail = f"no first token within judge.first_token_timeout_s={first_token_s:g}s"
            self._farm.failed(endpoint, "first_token", detail)
            self.unreachable(endpoint, detail)
            self._tokens.first_token_timeouts += 1
            hung = AttemptFailed("first_token", f"attempt {attempt_no}: {detail}")
            hung.endpoint = endpoint
            raise hung from None
        status = reply.status
        if 200 <= status <= 299:
            self._farm.succeeded(endpoint, time.perf_counter() - started)
        elif 500 <= status <= 599:
            self._farm.failed(endpoint, "http_5xx", f"HTTP {status}")
        elif status not in RETRYABLE_STATUSES:
            self._farm.answered(endpoint)
        return reply

    async def _exchange(
        self,
        body: bytes,
        attempt_no: int,
        endpoint: Endpoint,
        progress: JudgeProgress | None,
        first_token: asyncio.Timeout,
    ) -> Reply:
        """Send and read, retrying a refused connection ``connect_retries`` times."""
        wire = self._wire(endpoint)
        connects = 0
        while True:
            try:
                async with self._http().post(
                    wire.post_url, data=body, headers=wire.headers
                ) as response:
                    return await self._read(response, attempt_no, endpoint, progress, first_token)
            except aiohttp.ClientConnectorError as exc:
                if connects < self._connect_retries:
                    connects += 1
                    continue
                self._transport_failed(endpoint, exc)
                failure = self._transport_failure(exc, attempt_no, "cannot connect")
                failure.endpoint = endpoint
                raise failure from None
            except (aiohttp.ClientError, OSError) as exc:
                self._transport_failed(endpoint, exc)
                failure = self._transport_failure(
                    exc, attempt_no, "connection lost before the answer was complete"
                )
                failure.endpoint = endpoint
                raise failure from None
            except AttemptFailed as failure:  # oversized: the node answered
                self._farm.answered(endpoint)
                failure.endpoint = endpoint
                raise

    def _transport_failed(self, endpoint: Endpoint, exc: BaseException) -> None:
        detail = self._redact(describe(exc))
        self._farm.failed(endpoint, "transport", failure_class(exc))
        self.unreachable(endpoint, detail)

    async def _read(
        self,
        response: aiohttp.ClientResponse,
        attempt_no: int,
        endpoint: Endpoint,
        progress: JudgeProgress | None = None,
        first_token: asyncio.Timeout | None = None,
    ) -> Reply:
        retry_after = response.headers.get("Retry-After")
        if (
            self._config.judge.stream
            and 200 <= response.status <= 299
            and response.content_type == "text/event-stream"
        ):
            streamed, size = await self._read_stream(response, attempt_no, progress, first_token)
            return Reply(response.status, b"", retry_after, endpoint, streamed, size)
        if first_token is not None:
            # Not a stream (an error, or a server that ignores "stream"): the whole
            # answer is here already or comes as one body; the request deadline holds.
            first_token.reschedule(None)
        cap = self._config.judge.max_response_bytes
        declared = response.content_length
        if declared is not None:
            if declared > cap:
                response.close()  # drop the connection rather than drain an oversized body
                raise self._oversized(attempt_no, declared)
            # The body is exactly Content-Length bytes: one read, no chunk loop.
            body = await response.read()
            return Reply(response.status, body, retry_after, endpoint)
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(READ_CHUNK):
            size += len(chunk)
            if size > cap:
                response.close()
                raise self._oversized(attempt_no, size)
            chunks.append(chunk)
        return Reply(response.status, b"".join(chunks), retry_after, endpoint)

    async def _read_stream(
        self,
        response: aiohttp.ClientResponse,
        attempt_no: int,
        progress: JudgeProgress | None,
        first_token: asyncio.Timeout | None,
    ) -> tuple[Any, int]:
        """Read a server-sent-events answer; (the reassembled body, its text bytes).

        Every event that carries generated text counts one token towards ``progress``
        and the ledger's in-flight gauge while the request runs. Anything but a
        complete stream (an error, a cancellation: a hedge won, the cohort ended, the
        deadline) closes the connection, which makes vLLM abort the generation."""
        stream = SSEAnswer(self._config.judge.api, self._config.judge.max_response_bytes)
        ledger = self._tokens
        counted = 0
        complete = False
        loop = asyncio.get_running_loop()
        try:
            async for chunk in response.content.iter_any():
                if stream.pending_bytes + len(chunk) >= self._offload_bytes:
                    # A large event (a long answer in one piece) is decoded off the loop.
                    new = await loop.run_in_executor(self._executor, stream.feed, chunk)
                else:
                    new = stream.feed(chunk)
                if new:
                    if counted == 0 and first_token is not None:
                        first_token.reschedule(None)
                    counted += new
                    ledger.streamed_in_flight += new
                    if progress is not None:
                        progress.tokens += new
            # Read to the end even after the last event: the connection then stays
            # in the keep-alive pool (a server ends the body right after that event).
            if not stream.done:
                # As an interrupted non-streamed body: the connection is lost.
                raise aiohttp.ClientPayloadError("the stream ended before its last event")
            body = stream.body()
            complete = True
        except StreamTooLarge as exc:
            raise self._oversized(attempt_no, exc.size) from None
        except StreamError as exc:
            raise AttemptFailed(
                "invalid_body",
                f"attempt {attempt_no}: unreadable answer stream: {exc}",
            ) from None
        finally:
            ledger.streamed_in_flight -= counted
            if progress is not None:
                progress.tokens -= counted
            if not complete:
                response.close()
        return body, stream.text_bytes

    def _oversized(self, attempt_no: int, size: int) -> AttemptFailed:
        return AttemptFailed(
            "oversized",
            f"attempt {attempt_no}: response body over judge.max_response_bytes="
            f"{self._config.judge.max_response_bytes} ({size} bytes or more)",
            answered=True,
        )

    def _transport_failure(self, exc: BaseException, attempt_no: int, what: str) -> AttemptFailed:
        return AttemptFailed(
            "transport",
            f"attempt {attempt_no}: {what} ({failure_class(exc)})",
            outage=True,
            log_detail=f"attempt {attempt_no}: {what}: {self._redact(describe(exc))}",
        )
