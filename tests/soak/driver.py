"""The soak: thousands of groups through SubmitMember and StreamGroups under judge faults.

Run ``make soak`` (2,000 groups × 16 members) or ``python -m tests.soak.driver --help``;
``tests/soak/test_soak.py`` runs a small version in ``make test``. docs/soak.md explains
what is checked and records the numbers of a full run.

The server runs in this process (so ``runtime.stats()``, the tombstone store and RSS can
be inspected); the fake judge runs in a subprocess. Groups run in *waves*, each of one
kind in turn: a fault-free judge (where every judge call is counted exactly); a judge
injecting 503s, 429s with ``Retry-After: 0``, truncated bodies, invalid JSON, connection
resets, malformed verdicts, budget exhaustion and hangs past ``judge_request_timeout_s``;
a judge answering only adversarial texts (every pair falls back to the default
verdict); and a judge killed and restarted on the same port mid-wave. Every group plays
one scenario (normal, duplicates, cancel-then-resubmit, slot conflicts, supersession,
members that never arrive, oversized declared groups, two principals on one group id,
a stream that is not read) over unary calls, one stream, or both; every submission
records the one terminal outcome it got and is checked against the class its scenario
implies. ``--compare-tolerance S`` runs the same seeded soak with
``judge_outage_tolerance_s`` 0 and S and reports the masked share of each.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import logging
import math
import pathlib
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1.health_pb2 import HealthCheckRequest
from grpc_health.v1.health_pb2_grpc import HealthStub
from grpc_status import rpc_status

from genrm_grpc.cohort import model as cohort_model
from genrm_grpc.config import load_settings
from genrm_grpc.scoring import AnswerTexts, JudgedPair, Verdict, aggregate, extract_texts
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import fake_verdict, pair_key

from .judge import JudgeProcess

DOMAIN = "cohort.genrm.v1"
MARKER = "soak-answer"
SCENARIOS = (
    "normal",
    "duplicates",
    "cancel",
    "conflict",
    "supersede",
    "never",
    "oversized",
    "principals",
    "unread",
)
SCENARIO_WEIGHTS = (30, 20, 15, 13, 12, 10, 4, 6, 3)
#: What the judge does during a wave, in turn: fault-free, the random fault mix, only
#: adversarial answers, and a crash + restart of the judge process mid-wave.
WAVE_KINDS = ("clean", "faulty", "adversarial", "restart")
#: Principals of the soak's bearer tokens (``auth.tokens_file``); groups play as "a",
#: the second player of a ``principals`` group as "b".
TOKENS = {"a": "soak-token-a", "b": "soak-token-b"}
TRANSPORTS = ("unary", "stream", "mixed")
TOPICS = (
    "unit testing",
    "binary search trees",
    "garbage collection in managed runtimes",
    "tcp congestion control",
    "database index design",
    "the rust borrow checker",
    "gradient descent with momentum",
    "public key cryptography",
)
FILLER = tuple(
    [
        "because",
        "therefore",
        "example",
        "detail",
        "step",
        "result",
        "reason",
        "context",
        "case",
        "value",
        "note",
        "idea",
        "first",
        "second",
        "then",
        "finally",
        "overall",
        "however",
        "also",
        "simply",
        "clearly",
    ]
)

FAULTS_ON: dict[str, Any] = {
    "fail_503_rate": 0.06,
    "fail_429_rate": 0.05,
    "truncate_rate": 0.03,
    "invalid_json_rate": 0.02,
    "reset_rate": 0.01,
    "budget_exhaust_rate": 0.03,
    "malformed_rate": 0.05,
    "hang_rate": 0.002,
    "retry_after_s": 0.0,
}
FAULTS_OFF: dict[str, Any] = {name: 0.0 for name in FAULTS_ON if name.endswith("_rate")}


@dataclass(frozen=True)
class SoakConfig:
    groups: int = 2000
    size: int = 16
    wave: int = 200
    warmup_waves: int = 2
    concurrency: int = 16
    seed: int = 20240611
    collection_timeout_s: float = 3.0
    evaluation_timeout_s: float = 60.0
    judge_request_timeout_s: float = 2.0
    parse_retries: int = 3
    retry_sleep_s: float = 0.01
    max_terminal_cohorts: int = 256
    group_timeout_s: float = 120.0
    rss_tolerance: float = 0.10
    #: The server's ``judge_outage_tolerance_s`` (0: off, NeMo Gym's behaviour).
    judge_outage_tolerance_s: float = 0.0
    #: How long the judge stays down in a restart wave.
    restart_down_s: float = 1.5
    #: The server's ``stream_max_buffered_events``: small, so that an ``unread`` stream
    #: stops the server reading it.
    stream_max_buffered_events: int = 4
    #: Late copies an ``unread`` client writes after its group completed (each ~0.7 KB,
    #: more than an HTTP/2 flow-control window when they cannot be read).
    unread_late_copies: int = 160
    #: Length of the judge's adversarial answers. The verdict parser costs ~2.5 µs per
    #: character on the brace kinds (in a worker thread, holding the GIL), so 64 KiB
    #: answers in every request starve the shared event loop of this 2-core soak (see
    #: docs/soak.md); here they must be accounted for, not timed.
    adversarial_chars: int = 1024
    #: The judge's behaviour per wave, in turn (comma-separated WAVE_KINDS).
    wave_kinds: str = ",".join(WAVE_KINDS)

    def __post_init__(self) -> None:
        unknown = set(self.kinds()) - set(WAVE_KINDS)
        if unknown or not self.kinds():
            raise ValueError(f"wave_kinds must name some of {WAVE_KINDS}, got {self.wave_kinds!r}")

    def kinds(self) -> list[str]:
        return [k.strip() for k in self.wave_kinds.split(",") if k.strip()]


def faults_for(kind: str, cfg: SoakConfig) -> dict[str, Any]:
    """The judge's faults during a wave of ``kind``."""
    if kind == "faulty":
        return FAULTS_ON
    if kind == "adversarial":
        # Every request of every pair gets an answer without a verdict, built to slow a
        # parser down: each comparison spends its retries, then falls back to the
        # default verdict (unmasked, parse_failed).
        return {
            **FAULTS_OFF,
            "adversarial_first_n": cfg.parse_retries + 1,
            "adversarial_chars": cfg.adversarial_chars,
        }
    return {**FAULTS_OFF, "adversarial_first_n": 0}


# ----------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class ErrorOutcome:
    code: grpc.StatusCode
    reason: str
    message: str
    domain: str
    metadata: dict[str, str]
    error_infos: int


Observed = tuple[
    str, Any
]  # ("result", MemberResult) | ("error", ErrorOutcome) | ("cancelled", None)


def _decode_status(
    status: status_pb2.Status | None, code: grpc.StatusCode, message: str
) -> ErrorOutcome:
    infos = []
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                infos.append(info)
        message = status.message
    first = infos[0] if infos else error_details_pb2.ErrorInfo()
    return ErrorOutcome(
        code=code,
        reason=first.reason,
        message=message,
        domain=first.domain,
        metadata=dict(first.metadata),
        error_infos=len(infos),
    )


def call_error(exc: grpc.RpcError) -> ErrorOutcome:
    return _decode_status(rpc_status.from_call(exc), exc.code(), exc.details() or "")


def stream_error(status: status_pb2.Status) -> ErrorOutcome:
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), grpc.StatusCode.UNKNOWN)
    return _decode_status(status, code, status.message)


@dataclass(frozen=True)
class Expect:
    """The outcome class a submission's scenario implies."""

    kind: str  # result | result_any | replay | error | cancelled | deadline
    code: grpc.StatusCode | None = None
    reason: str = ""
    contains: str = ""
    metadata: tuple[tuple[str, str], ...] = ()

    def label(self) -> str:
        if self.kind == "error":
            assert self.code is not None
            return f"error:{self.code.name}:{self.reason}"
        return self.kind

    def accepts(self, obs: Observed) -> bool:
        kind, value = obs
        if self.kind in ("result", "result_any", "replay"):
            if kind != "result":
                return False
            return self.kind == "result_any" or value.replayed == (self.kind == "replay")
        if self.kind == "cancelled":
            return kind == "cancelled"
        if kind != "error":
            return False
        if self.kind == "deadline":
            return bool(value.code == grpc.StatusCode.DEADLINE_EXCEEDED)
        return bool(
            value.code == self.code
            and value.reason == self.reason
            and value.domain == DOMAIN
            and value.error_infos == 1
            and self.contains in value.message
            and all(value.metadata.get(k) == v for k, v in self.metadata)
        )


RESULT = Expect("result")
RESULT_ANY = Expect("result_any")
REPLAY = Expect("replay")
CANCELLED = Expect("cancelled")
DEADLINE = Expect("deadline")


def describe(obs: Observed | None) -> str:
    if obs is None:
        return "no outcome"
    kind, value = obs
    if kind == "result":
        return f"result(masked={value.mask_sample}, replayed={value.replayed})"
    if kind == "error":
        return (
            f"error({value.code.name}, reason={value.reason!r}, infos={value.error_infos}, "
            f"message={value.message[:160]!r})"
        )
    return kind


# ----------------------------------------------------------------------------- groups


@dataclass(frozen=True)
class Answer:
    candidate: pb.Candidate
    texts: AnswerTexts


@dataclass(eq=False)
class Sub:
    """One submission (one RPC, or one request on a stream) and its single outcome."""

    group: Group
    attempt: int
    index: int
    answer: Answer
    expect: Expect
    outcome: Observed | None = None
    #: The group_size this submission declares (the group's own unless set).
    declared: int | None = None

    def request(self) -> pb.SubmitMemberRequest:
        g = self.group
        ref = pb.MemberRef(
            group_id=g.gid,
            group_attempt=self.attempt,
            rollout_index=self.index,
            group_size=self.declared or g.size,
        )
        return pb.SubmitMemberRequest(member=ref, prompt=g.prompt, candidate=self.answer.candidate)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.group.gid, self.attempt, self.index)

    def observe(self, obs: Observed) -> None:
        if self.outcome is not None:
            self.group.violation(
                f"slot {self.index} attempt {self.attempt}: a second terminal outcome "
                f"{describe(obs)} after {describe(self.outcome)}"
            )
            return
        self.outcome = obs


@dataclass(eq=False)
class Group:
    number: int
    gid: str
    scenario: str
    transport: str
    kind: str
    size: int
    prompt: pb.Prompt
    last_user: str
    rng: random.Random
    main_attempt: int = 0
    complete: bool = True
    #: Members the server holds per attempt (judge pairs among them are counted).
    present: dict[int, set[int]] = field(default_factory=dict)
    answers: dict[tuple[int, int], Answer] = field(default_factory=dict)
    subs: list[Sub] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    masked: bool | None = None
    #: The client worker (one connection each) playing this group.
    worker: int = 0
    #: Who plays this group (a key of TOKENS).
    principal: str = "a"
    #: Groups played alongside under the same group id by another principal.
    twins: list[Group] = field(default_factory=list)

    @property
    def faulty(self) -> bool:
        return self.kind != "clean"

    def violation(self, text: str) -> None:
        self.violations.append(
            f"group {self.gid} as {self.principal} [{self.scenario}/{self.transport}/"
            f"{self.kind}]: {text}"
        )

    def answer(self, attempt: int, index: int, variant: str = "") -> Answer:
        key = (attempt, index)
        if not variant and key in self.answers:
            return self.answers[key]
        rng = self.rng
        topic_words = self.last_user.lower().rstrip(".").split()
        words = rng.sample(topic_words, rng.randint(0, len(topic_words)))
        words += rng.choices(FILLER, k=rng.randint(0, 70))
        text = f"{MARKER} {self.gid}@{self.principal} a{attempt} r{index}{variant}: " + " ".join(
            words
        )
        reasoning = f"reasoning for r{index}: " + " ".join(
            rng.choices(FILLER, k=rng.randint(0, 12))
        )
        if (
            not variant
            and attempt == self.main_attempt
            and index == 3
            and self.number % 9 == 0
            and self.principal == "a"
        ):
            text, reasoning = "", ""  # an empty answer: the judge sees the literal "None"
        if rng.random() < 0.25:
            obj = {
                "output": [
                    {"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]},
                    {
                        "type": "message",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    },
                ]
            }
            answer = Answer(pb.Candidate(responses_api_json=json.dumps(obj)), extract_texts(obj))
        else:
            answer = Answer(
                pb.Candidate(output_text=text, reasoning_text=reasoning),
                AnswerTexts(reasoning=reasoning, answer=text),
            )
        if not variant:
            self.answers[key] = answer
        return answer

    def sub(
        self,
        attempt: int,
        index: int,
        expect: Expect,
        *,
        variant: str = "",
        declared: int | None = None,
    ) -> Sub:
        s = Sub(self, attempt, index, self.answer(attempt, index, variant), expect, None, declared)
        self.subs.append(s)
        return s

    def judge_text(self, attempt: int, index: int) -> str:
        return self.answers[(attempt, index)].texts.judge_text()

    def pair_keys(self, attempt: int, members: Iterable[int] | None = None) -> list[str]:
        """Fake-judge counter keys of the circular pairs among ``members``."""
        present = set(range(self.size) if members is None else members)
        return [
            pair_key(self.judge_text(attempt, i), self.judge_text(attempt, (i + 1) % self.size))
            for i in range(self.size)
            if i in present and (i + 1) % self.size in present
        ]


# ----------------------------------------------------------------------------- transport


class Stream:
    """One StreamGroups call whose requests are fed on demand; events matched to Subs."""

    def __init__(
        self,
        clients: Clients,
        stub: pb_grpc.CohortServiceStub,
        timeout: float,
        metadata: tuple[tuple[str, str], ...],
        *,
        read: bool = True,
    ) -> None:
        self._clients = clients
        self._stub = stub
        self._timeout = timeout
        self._metadata = metadata
        self._queue: asyncio.Queue[pb.StreamGroupsRequest | None] = asyncio.Queue()
        self._call = stub.StreamGroups(
            self._requests(self._queue), timeout=timeout, metadata=metadata
        )
        self._cond = asyncio.Condition()
        self._cancelled = False
        self._closed = False
        self._seen_event = False
        self.sent: list[Sub] = []
        self.accepted = 0
        self.terminal = 0
        self.events: dict[tuple[str, int, int], list[Observed]] = collections.defaultdict(list)
        self.end: grpc.StatusCode | None = None
        self.end_details = ""
        self.done = False
        self._go = asyncio.Event()
        if read:
            self._go.set()
        self._reader = asyncio.create_task(self._read())

    def start_reading(self) -> None:
        self._go.set()

    async def _requests(self, queue: asyncio.Queue[pb.StreamGroupsRequest | None]) -> Any:
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    def _restart(self) -> None:
        """Resend everything on a new call (the old one never reached the servicer)."""
        self._queue = asyncio.Queue()
        for sub in self.sent:
            self._queue.put_nowait(pb.StreamGroupsRequest(member=sub.request()))
        if self._closed:
            self._queue.put_nowait(None)
        self._call = self._stub.StreamGroups(
            self._requests(self._queue), timeout=self._timeout, metadata=self._metadata
        )

    def send(self, *subs: Sub) -> None:
        for sub in subs:
            self.sent.append(sub)
            self._queue.put_nowait(pb.StreamGroupsRequest(member=sub.request()))

    async def _read(self) -> None:
        await self._go.wait()
        try:
            while True:
                try:
                    await self._read_call()
                except grpc.RpcError as exc:
                    if self._clients.transport_failure(exc) and not self._seen_event:
                        self._restart()
                        continue
                    raise
                break
            self.end = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.end, self.end_details = exc.code(), exc.details() or ""
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            self.end = grpc.StatusCode.CANCELLED
        finally:
            self.done = True
            async with self._cond:
                self._cond.notify_all()

    async def _read_call(self) -> None:
        async for event in self._call:
            self._seen_event = True
            kind = event.WhichOneof("event")
            if kind == "accepted":
                self.accepted += 1
            elif kind == "result":
                ref = event.result.member
                key = (ref.group_id, ref.group_attempt, ref.rollout_index)
                self.events[key].append(("result", event.result))
                self.terminal += 1
            elif kind == "error":
                ref = event.error.member
                key = (ref.group_id, ref.group_attempt, ref.rollout_index)
                self.events[key].append(("error", stream_error(event.error.status)))
                self.terminal += 1
            async with self._cond:
                self._cond.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: predicate() or self.done)
        if not predicate():
            raise StreamBroken(f"stream ended ({self.end}, {self.end_details!r}) before {what}")

    async def cancel(self) -> None:
        self._cancelled = True
        self._go.set()
        self._call.cancel()
        await self._reader
        self._assign(cancelled=True)

    async def finish(self, group: Group) -> None:
        self._closed = True
        self._queue.put_nowait(None)
        self._go.set()
        await self._reader
        if self.end != grpc.StatusCode.OK:
            group.violation(f"stream ended with {self.end} {self.end_details!r}, not OK")
        self._assign(cancelled=False)

    def _assign(self, *, cancelled: bool) -> None:
        by_key: dict[tuple[str, int, int], list[Sub]] = collections.defaultdict(list)
        for sub in self.sent:
            by_key[sub.key].append(sub)
        for key, subs in by_key.items():
            unmatched = list(subs)
            for obs in self.events.pop(key, []):
                match = next((s for s in unmatched if s.expect.accepts(obs)), None)
                if match is None:
                    match = unmatched[0] if unmatched else None
                if match is None:
                    subs[0].group.violation(
                        f"stream: an extra terminal event for {key}: {describe(obs)}"
                    )
                    continue
                unmatched.remove(match)
                match.observe(obs)
            for sub in unmatched:
                if cancelled:
                    sub.observe(("cancelled", None))
                else:
                    sub.group.violation(f"stream: no terminal event for {key} (lost)")
        for key, extra in self.events.items():
            if self.sent:
                self.sent[0].group.violation(f"stream: events for a key never sent {key}: {extra}")


class StreamBroken(Exception):
    pass


@dataclass
class Clients:
    stubs: list[pb_grpc.CohortServiceStub]
    timeout: float
    #: Calls resent after UNAVAILABLE without ErrorInfo (a transport failure; the
    #: protocol says: resend the identical call).
    transport_retries: int = 0
    max_transport_retries: int = 5
    unread_late_copies: int = 160

    def stub(self, group: Group) -> pb_grpc.CohortServiceStub:
        return self.stubs[group.worker]

    @staticmethod
    def metadata(group: Group) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKENS[group.principal]}"),)

    def transport_failure(self, exc: grpc.RpcError) -> bool:
        """UNAVAILABLE without ErrorInfo: count it and say whether to resend."""
        if exc.code() != grpc.StatusCode.UNAVAILABLE or call_error(exc).error_infos:
            return False
        self.transport_retries += 1
        return True

    async def unary(self, sub: Sub, *, timeout: float | None = None) -> None:
        stub = self.stub(sub.group)
        for attempt in range(self.max_transport_retries + 1):
            try:
                response = await stub.SubmitMember(
                    sub.request(),
                    timeout=timeout or self.timeout,
                    metadata=self.metadata(sub.group),
                )
            except grpc.RpcError as exc:
                if attempt < self.max_transport_retries and self.transport_failure(exc):
                    continue
                sub.observe(("error", call_error(exc)))
            else:
                sub.observe(("result", response.result))
            return

    async def get_cohort(self, group: Group, attempt: int) -> pb.CohortInfo:
        request = pb.GetCohortRequest(
            member=pb.MemberRef(group_id=group.gid, group_attempt=attempt)
        )
        for tries in range(self.max_transport_retries + 1):
            try:
                response = await self.stub(group).GetCohort(
                    request, timeout=self.timeout, metadata=self.metadata(group)
                )
            except grpc.RpcError as exc:
                if tries < self.max_transport_retries and self.transport_failure(exc):
                    continue
                raise
            info: pb.CohortInfo = response.cohort
            return info
        raise AssertionError("unreachable")

    async def unary_cancelled(self, sub: Sub) -> None:
        """Start a call and cancel it at once: the server may or may not have seen it."""
        call = self.stub(sub.group).SubmitMember(
            sub.request(), timeout=self.timeout, metadata=self.metadata(sub.group)
        )
        call.cancel()
        try:
            response = await call
        except asyncio.CancelledError:
            sub.observe(("cancelled", None))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                sub.observe(("cancelled", None))
            else:
                sub.observe(("error", call_error(exc)))
        else:
            sub.observe(("result", response.result))

    def stream(self, group: Group, *, read: bool = True) -> Stream:
        return Stream(self, self.stub(group), self.timeout, self.metadata(group), read=read)

    async def submit(self, group: Group, subs: Sequence[Sub]) -> None:
        """All ``subs`` over the group's transport; returns when each has its outcome."""
        if group.transport == "unary":
            await asyncio.gather(*(self.unary(s) for s in subs))
            return
        if group.transport == "stream":
            on_stream, unary = list(subs), []
        else:
            on_stream, unary = list(subs[::2]), list(subs[1::2])
        stream = self.stream(group)
        stream.send(*on_stream)
        await asyncio.gather(stream.finish(group), *(self.unary(s) for s in unary))


# ----------------------------------------------------------------------------- scenarios


async def play(clients: Clients, g: Group) -> None:
    if g.scenario == "oversized":
        await _oversized(clients, g)
    elif g.scenario == "principals":
        await _principals(clients, g)
    elif g.scenario == "unread":
        await _unread(clients, g)
    else:
        await _play_basic(clients, g)


async def _play_basic(clients: Clients, g: Group) -> None:
    n, rng = g.size, g.rng
    if g.scenario == "normal":
        await clients.submit(g, [g.sub(0, k, RESULT) for k in range(n)])
        g.present[0] = set(range(n))
    elif g.scenario == "duplicates":
        subs = [g.sub(0, k, RESULT_ANY) for k in range(n) for _ in range(rng.choice((2, 3)))]
        rng.shuffle(subs)
        await clients.submit(g, subs)
        g.present[0] = set(range(n))
        await clients.unary(g.sub(0, rng.randrange(n), REPLAY))
    elif g.scenario == "cancel":
        await _cancel_then_resubmit(clients, g)
    elif g.scenario == "conflict":
        k = rng.randrange(n)
        conflict = Expect("error", grpc.StatusCode.ALREADY_EXISTS, "SLOT_CONFLICT")
        side = clients.stream(g)
        # Requests on one stream are handled in order: the original fills the slot first.
        side.send(g.sub(0, k, RESULT), g.sub(0, k, conflict, variant=" (regenerated)"))
        rest = [g.sub(0, i, RESULT) for i in range(n) if i != k]
        await asyncio.gather(side.finish(g), clients.submit(g, rest))
        g.present[0] = set(range(n))
        late = rng.randrange(n)
        await clients.unary(g.sub(0, late, conflict, variant=" (regenerated late)"))
    elif g.scenario == "supersede":
        await _supersede(clients, g)
    elif g.scenario == "never":
        missing = set(rng.sample(range(n), rng.randint(1, min(3, n - 1))))
        failed = Expect(
            "error", grpc.StatusCode.ABORTED, "COHORT_FAILED", contains="collection deadline"
        )
        await clients.submit(g, [g.sub(0, k, failed) for k in range(n) if k not in missing])
        g.complete = False
        g.present[0] = set(range(n)) - missing
        late = rng.choice(sorted(g.present[0]))
        await clients.unary(
            g.sub(0, late, Expect("error", grpc.StatusCode.ABORTED, "COHORT_FAILED"))
        )
    else:
        raise ValueError(g.scenario)


def oversized_size(size: int) -> int:
    """A group_size needing more judge passes than the soak's max_judge_passes_per_cohort."""
    return max_passes(size) + 1


def max_passes(size: int) -> int:
    """The soak server's ``max_judge_passes_per_cohort``: circular pairs of 4 groups."""
    return 4 * size


async def cohort_not_found(clients: Clients, g: Group, what: str) -> None:
    """GetCohort of ``g``'s id as ``g``'s principal must answer NOT_FOUND/COHORT_NOT_FOUND."""
    try:
        info = await clients.get_cohort(g, 0)
    except grpc.RpcError as exc:
        err = call_error(exc)
        if (err.code, err.reason, err.error_infos) != (
            grpc.StatusCode.NOT_FOUND,
            "COHORT_NOT_FOUND",
            1,
        ):
            g.violation(f"GetCohort {what}: {describe(('error', err))}, not COHORT_NOT_FOUND")
        return
    g.violation(
        f"GetCohort {what} found a cohort: phase {info.phase}, present {list(info.present_indices)}"
    )


async def cohort_info(
    clients: Clients, g: Group, attempt: int, until: Callable[[pb.CohortInfo], bool]
) -> pb.CohortInfo:
    """Poll GetCohort until ``until`` holds (the worker's group deadline bounds it)."""
    while True:
        try:
            info = await clients.get_cohort(g, attempt)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
        else:
            if until(info):
                return info
        await asyncio.sleep(0.02)


async def _oversized(clients: Clients, g: Group) -> None:
    """Every member first declares a group too large for max_judge_passes_per_cohort:
    INVALID_ARGUMENT at once, nothing held; then the group is sent as it should be."""
    n = g.size
    big = oversized_size(n)
    refused = Expect(
        "error",
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_MEMBER",
        contains=f"group_size {big} needs",
    )
    # A member the server held instead of refusing would wait for a group that can never
    # fill and end ABORTED at the collection deadline: a violation.
    await clients.submit(g, [g.sub(0, k, refused, declared=big) for k in range(n)])
    await cohort_not_found(clients, g, "after oversized members")
    await clients.submit(g, [g.sub(0, k, RESULT) for k in range(n)])
    g.present[0] = set(range(n))


async def _principals(clients: Clients, g: Group) -> None:
    """Principals a and b play the same group id with different answers, at once."""
    n = g.size
    twin = Group(
        number=g.number,
        gid=g.gid,
        scenario=g.scenario,
        transport=g.rng.choice(TRANSPORTS),
        kind=g.kind,
        size=n,
        prompt=g.prompt,
        last_user=g.last_user,
        rng=random.Random(g.rng.getrandbits(64)),
        worker=g.worker,
        principal="b",
    )
    g.twins.append(twin)
    first = asyncio.create_task(clients.submit(g, [g.sub(0, k, RESULT) for k in range(n - 1)]))
    try:
        await cohort_info(clients, g, 0, lambda i: len(i.present_indices) == n - 1)
        # a's cohort holds n - 1 members; b sees nothing under the same group id.
        await cohort_not_found(clients, twin, "of a's collecting group, as b")
        await asyncio.gather(
            clients.submit(twin, [twin.sub(0, k, RESULT) for k in range(n)]),
            clients.unary(g.sub(0, n - 1, RESULT)),
        )
    finally:
        await first
    g.present[0] = set(range(n))
    twin.present[0] = set(range(n))


async def _unread(clients: Clients, g: Group) -> None:
    """A stream client that writes its group and does not read until GetCohort shows the
    group completed; then it writes ``unread_late_copies`` copies (replays, answered at
    once: far more events than ``stream_max_buffered_events``) and reads. Every request
    must get exactly one outcome and the stream must end OK."""
    n, rng = g.size, g.rng
    stream = clients.stream(g, read=False)
    stream.send(*(g.sub(0, k, RESULT) for k in range(n)))
    g.present[0] = set(range(n))
    await cohort_info(clients, g, 0, lambda i: i.phase == pb.COHORT_PHASE_COMPLETED)
    late = [g.sub(0, rng.randrange(n), REPLAY) for _ in range(clients.unread_late_copies)]
    stream.send(*late)
    stream.start_reading()
    await stream.finish(g)


async def _cancel_then_resubmit(clients: Clients, g: Group) -> None:
    n, rng = g.size, g.rng
    victims = rng.sample(range(n), rng.randint(1, 3))
    must_be_present: set[int] = set()
    for k in victims:
        how = rng.choice(("deadline", "cancel", "stream"))
        if how == "deadline":
            # The group cannot complete before the rest is sent: the deadline must expire.
            await clients.unary(g.sub(0, k, DEADLINE), timeout=0.1)
        elif how == "cancel":
            await clients.unary_cancelled(g.sub(0, k, CANCELLED))
        else:
            stream = clients.stream(g)
            stream.send(g.sub(0, k, CANCELLED))
            await stream.wait_for(lambda s=stream: s.accepted >= 1, "accepted")
            await stream.cancel()
            must_be_present.add(k)
    if must_be_present:
        info = await clients.get_cohort(g, 0)
        missing = must_be_present - set(info.present_indices)
        if missing or info.phase != pb.COHORT_PHASE_COLLECTING:
            g.violation(
                f"after cancelling accepted members {sorted(must_be_present)} the cohort shows "
                f"phase {info.phase} present {list(info.present_indices)}"
            )
    # Identical resubmission of every member: a cancelled one reattaches or refills its
    # slot. If the server already held it, the others can complete the group before the
    # resubmission arrives, which then replays the result.
    resubmitted = [g.sub(0, k, RESULT_ANY if k in victims else RESULT) for k in range(n)]
    await clients.submit(g, resubmitted)
    g.present[0] = set(range(n))


async def _supersede(clients: Clients, g: Group) -> None:
    n, rng = g.size, g.rng
    g.main_attempt = 1
    first = sorted(rng.sample(range(n), max(1, n // 2)))
    aborted = Expect(
        "error", grpc.StatusCode.ABORTED, "COHORT_FAILED", contains="superseded by attempt 1"
    )
    old = clients.stream(g)
    old.send(*(g.sub(0, k, aborted) for k in first))
    await old.wait_for(lambda: old.accepted >= len(first), "attempt 0 accepted")
    g.present[0] = set(first)
    newer = asyncio.create_task(clients.submit(g, [g.sub(1, k, RESULT) for k in range(n)]))
    try:
        await old.wait_for(lambda: old.terminal >= len(first), "attempt 0 aborted")
        superseded = Expect(
            "error",
            grpc.StatusCode.FAILED_PRECONDITION,
            "ATTEMPT_SUPERSEDED",
            metadata=(("latestAttempt", "1"),),
        )
        rest = [k for k in range(n) if k not in first]
        late = [*rng.sample(rest, min(2, len(rest))), rng.choice(first)]
        old.send(*(g.sub(0, k, superseded) for k in late))
        await old.finish(g)
    finally:
        await newer
    g.present[1] = set(range(n))


# ----------------------------------------------------------------------------- checks


def check_group(g: Group, scoring: Any, retries: int, tolerant: bool = False) -> None:
    for s in g.subs:
        if s.outcome is None:
            g.violation(f"slot {s.index} attempt {s.attempt}: lost (no terminal outcome)")
        elif not s.expect.accepts(s.outcome):
            g.violation(
                f"slot {s.index} attempt {s.attempt}: expected {s.expect.label()}"
                f"{' containing ' + repr(s.expect.contains) if s.expect.contains else ''}, "
                f"got {describe(s.outcome)}"
            )
    results = [
        (s, s.outcome[1])
        for s in g.subs
        if s.attempt == g.main_attempt and s.outcome is not None and s.outcome[0] == "result"
    ]
    if not g.complete:
        if results:
            g.violation("an incomplete group published results")
        return
    slots = {s.index for s, _ in results}
    if slots != set(range(g.size)):
        g.violation(f"results for slots {sorted(slots)}, expected all of 0..{g.size - 1}")
        return
    masks = {r.mask_sample for _, r in results}
    if len(masks) != 1:
        g.violation("masked and rewarded results in one group")
        return
    g.masked = masks.pop()
    if g.masked and g.kind not in ("faulty", "restart"):
        g.violation(f"masked in a {g.kind} wave: {results[0][1].failure_reason[:200]!r}")
    if g.masked and g.kind == "restart" and tolerant:
        g.violation(
            "masked by a judge restart shorter than judge_outage_tolerance_s: "
            f"{results[0][1].failure_reason[:200]!r}"
        )
    for s, r in results:
        if (r.member.group_id, r.member.group_attempt, r.member.rollout_index) != s.key:
            g.violation(f"result for {s.key} names {r.member}")
    if g.masked:
        for _, r in results:
            if not (
                r.failure_kind == pb.FAILURE_KIND_JUDGE_FAILED
                and r.failure_reason
                and len(r.failure_reason) <= 2000
                and r.reward == 0.0
            ):
                g.violation(f"masked result malformed: {r.failure_kind} {r.failure_reason!r}")
        return
    _check_rewards(g, results, scoring)


def _check_rewards(g: Group, results: list[tuple[Sub, pb.MemberResult]], scoring: Any) -> None:
    metrics = dict(results[0][1].group_metrics)
    rewards: dict[int, float] = {}
    verdicts: dict[tuple[int, int, int], pb.PairVerdict] = {}
    for s, r in results:
        if not all(math.isfinite(v) for v in (r.reward, r.reward_score_raw)):
            g.violation(f"slot {s.index}: non-finite reward {r.reward}")
        if dict(r.group_metrics) != metrics:
            g.violation(f"slot {s.index}: group_metrics differ from slot {results[0][0].index}")
        if rewards.setdefault(s.index, r.reward) != r.reward:
            g.violation(f"slot {s.index}: two different rewards {rewards[s.index]} / {r.reward}")
        for v in r.comparisons:
            key = (v.judge_index, v.response_i, v.response_j)
            if verdicts.setdefault(key, v) != v:
                g.violation(f"pair {key}: members report different verdicts")
    n, a = g.size, g.main_attempt
    expected_pairs = [(0, i, (i + 1) % n) for i in range(n)]
    if sorted(verdicts) != sorted(expected_pairs):
        g.violation(f"judged pairs {sorted(verdicts)} are not the circular pairs")
        return
    judged = []
    for key in expected_pairs:
        v = verdicts[key]
        _, i, j = key
        if v.parse_failed:
            if g.kind not in ("faulty", "adversarial"):
                g.violation(f"pair {key}: parse failure in a {g.kind} wave")
        elif g.kind == "adversarial":
            g.violation(f"pair {key}: a verdict {v} although every judge answer was adversarial")
        else:
            want = fake_verdict(g.last_user, g.judge_text(a, i), g.judge_text(a, j))
            if (v.score_1, v.score_2, v.ranking) != want:
                g.violation(f"pair {key}: verdict {v} is not the judge's {want} for this attempt")
        judged.append(JudgedPair(i, j, 0, Verdict(v.score_1, v.score_2, v.ranking, v.parse_failed)))
    texts = [g.answers[(a, k)].texts for k in range(n)]
    scores = aggregate(texts, judged, scoring)
    for k in range(n):
        if scores.members[k].reward != rewards[k]:
            g.violation(f"slot {k}: reward {rewards[k]} != aggregate {scores.members[k].reward}")
    for name, value in scores.metrics.items():
        if metrics.get(name) != value:
            g.violation(f"group metric {name}: {metrics.get(name)} != aggregate {value}")


def check_judge_counts(
    g: Group, pairs: dict[str, int], retries: int, outage_tolerance: bool = False
) -> int:
    """Per-pair judge requests of this group; returns the number of logical comparisons.

    With ``outage_tolerance`` (``judge_outage_tolerance_s`` > 0) outage-class failures
    (503, resets, truncated bodies, timeouts) do not spend ``genrm_parse_retries``, so a
    faulted pair may cost more than ``retries + 1`` requests: only the lower bound holds.
    """
    most = math.inf if outage_tolerance else retries + 1
    comparisons = 0
    for attempt, present in g.present.items():
        full = attempt == g.main_attempt and g.complete
        keys = g.pair_keys(attempt, present)
        counts = [pairs.get(k, 0) for k in keys]
        if not full:
            if any(counts):
                g.violation(f"attempt {attempt} was never full but its pairs were judged {counts}")
            continue
        comparisons += len(keys)
        if g.kind == "clean":
            if counts != [1] * len(keys):
                g.violation(f"fault-free judge requests per pair {counts}, expected exactly 1")
        elif g.kind == "adversarial":
            if counts != [retries + 1] * len(keys):
                g.violation(
                    f"adversarial judge requests per pair {counts}, expected {retries + 1} each"
                )
        elif g.kind == "restart":
            # Requests answered between the last /stats read and the crash are counted by
            # no process; whether a pair was judged is checked by its verdict instead.
            continue
        elif g.masked:
            if any(c > most for c in counts) or not any(counts):
                g.violation(f"masked group judge requests per pair {counts}")
        elif any(not 1 <= c <= most for c in counts):
            g.violation(f"rewarded group judge requests per pair {counts} not in [1, {most}]")
    return comparisons


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def settled_rss_kib() -> int:
    gc.collect()
    return rss_kib()


def walk_strings(root: object, limit: int = 100_000) -> Iterable[str]:
    """Every string reachable from ``root`` through gc referents (a tombstone's contents)."""
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            yield obj
            continue
        if isinstance(obj, type | bytes | int | float):
            continue
        stack.extend(gc.get_referents(obj))


# ----------------------------------------------------------------------------- the run


class ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()[:300]}")


@dataclass
class SoakReport:
    config: dict[str, Any]
    seconds: float = 0.0
    groups: int = 0
    submissions: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    scenarios: dict[str, int] = field(default_factory=dict)
    transports: dict[str, int] = field(default_factory=dict)
    rewarded_groups: int = 0
    masked_groups: int = 0
    failed_groups: int = 0
    faulty_groups: int = 0
    #: Groups per wave kind, and the masked and rewarded ones among them.
    wave_kinds: dict[str, int] = field(default_factory=dict)
    masked_by_kind: dict[str, int] = field(default_factory=dict)
    rewarded_by_kind: dict[str, int] = field(default_factory=dict)
    #: Masked groups / judged (masked + rewarded) groups, principal b's included.
    masked_share: float = 0.0
    #: Groups principal b played under principal a's group ids.
    twin_groups: int = 0
    unread_groups: int = 0
    judge_restarts: int = 0
    judge_comparisons: int = 0
    judge_requests: int = 0
    judge_outcomes: dict[str, int] = field(default_factory=dict)
    straggler_requests: int = 0
    transport_retries: int = 0
    runtime_stats: dict[str, int] = field(default_factory=dict)
    store_counts: dict[str, int] = field(default_factory=dict)
    tombstones_checked: int = 0
    leftover_objects: dict[str, int] = field(default_factory=dict)
    rss_baseline_kib: int = 0
    rss_end_kib: int = 0
    rss_peak_kib: int = 0
    logged_errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0

    def failures(self) -> list[str]:
        out = list(self.violations)
        if self.violation_count > len(self.violations):
            out.append(f"... {self.violation_count - len(self.violations)} more violations")
        for name in ("live_cohorts", "active_cohorts", "waiters", "owned_tasks", "judge_in_flight"):
            if self.runtime_stats.get(name, 0) != 0:
                out.append(f"runtime.stats()[{name!r}] = {self.runtime_stats[name]} after the soak")
        if self.store_counts.get("active_cohorts", 0):
            out.append(f"store still holds active cohorts: {self.store_counts}")
        for name, count in self.leftover_objects.items():
            if count:
                out.append(f"{count} {name} objects (answer bodies) still alive after the soak")
        if self.tombstones_checked == 0:
            out.append("no tombstone was inspected")
        limit = self.rss_baseline_kib * (1 + self.config["rss_tolerance"])
        if self.rss_end_kib > limit:
            out.append(
                f"RSS {self.rss_end_kib} KiB after the soak exceeds the baseline "
                f"{self.rss_baseline_kib} KiB by more than {self.config['rss_tolerance']:.0%}"
            )
        out.extend(f"logged error: {e}" for e in self.logged_errors)
        return out

    def summary(self) -> str:
        lines = [
            f"soak: {self.groups} groups x {self.config['size']} members in {self.seconds:.1f}s "
            f"({self.submissions} submissions, {self.submissions / max(self.seconds, 1e-9):.0f}/s)",
            f"  scenarios {self.scenarios}",
            f"  transports {self.transports}",
            f"  outcomes {self.outcomes}",
            f"  groups: rewarded {self.rewarded_groups}, masked {self.masked_groups}, "
            f"failed/aborted {self.failed_groups}; judge-faulted {self.faulty_groups}",
            f"  judge_outage_tolerance_s={self.config['judge_outage_tolerance_s']:g}: "
            f"masked share {self.masked_share:.2%}; masked by wave kind {self.masked_by_kind}, "
            f"rewarded {self.rewarded_by_kind} (groups {self.wave_kinds}, "
            f"{self.judge_restarts} judge restarts)",
            f"  hostile: {self.twin_groups} group ids played by two principals, "
            f"{self.unread_groups} streams not read until their group completed",
            f"  judge: {self.judge_comparisons} comparisons, {self.judge_requests} HTTP requests "
            f"({self.straggler_requests} late from cancelled calls), "
            f"outcomes {self.judge_outcomes}",
            f"  transport: {self.transport_retries} calls resent after UNAVAILABLE without "
            "ErrorInfo",
            f"  after: runtime {self.runtime_stats}, store {self.store_counts}, "
            f"{self.tombstones_checked} tombstones inspected, leftovers {self.leftover_objects}",
            f"  RSS: baseline {self.rss_baseline_kib} KiB, end {self.rss_end_kib} KiB "
            f"({(self.rss_end_kib / max(1, self.rss_baseline_kib) - 1):+.1%}), "
            f"peak {self.rss_peak_kib} KiB",
        ]
        failures = self.failures()
        lines.append(f"  {'PASS' if not failures else 'FAIL'}: {len(failures)} failures")
        lines.extend(f"    - {f}" for f in failures[:40])
        return "\n".join(lines)


def make_groups(cfg: SoakConfig) -> list[Group]:
    master = random.Random(cfg.seed)
    kinds = cfg.kinds()
    groups = []
    for number in range(cfg.groups):
        rng = random.Random(master.getrandbits(64))
        topic = TOPICS[number % len(TOPICS)]
        question = f"Explain {topic} briefly with one example."
        prompt = pb.Prompt(
            messages=[
                pb.ChatMessage(role="system", content="You are a concise tutor."),
                pb.ChatMessage(role="user", content=question),
            ]
        )
        groups.append(
            Group(
                number=number,
                gid=f"soak/{cfg.seed}/{number}",
                scenario=rng.choices(SCENARIOS, SCENARIO_WEIGHTS)[0],
                transport=rng.choice(TRANSPORTS),
                kind=kinds[(number // cfg.wave) % len(kinds)],
                size=cfg.size,
                prompt=prompt,
                last_user=question,
                rng=rng,
            )
        )
    return groups


async def run_soak(cfg: SoakConfig, *, progress: Callable[[str], None] | None = None) -> SoakReport:
    report = SoakReport(config=asdict(cfg))
    errors = ErrorCounter()
    root, ours = logging.getLogger(), logging.getLogger("genrm_grpc")
    saved_level = ours.level
    ours.setLevel(logging.ERROR)  # judge retries and masked cohorts log warnings by design
    root.addHandler(errors)
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            tokens = pathlib.Path(tmp) / "tokens"
            tokens.write_text("".join(f"{p}:{t}\n" for p, t in TOKENS.items()))
            async with JudgeProcess(seed=cfg.seed) as judge:
                await _run(cfg, judge, tokens, report, progress or (lambda _line: None))
    finally:
        root.removeHandler(errors)
        ours.setLevel(saved_level)
    report.logged_errors = errors.records[:20]
    return report


async def _run(
    cfg: SoakConfig,
    judge: JudgeProcess,
    tokens: pathlib.Path,
    report: SoakReport,
    progress: Callable[[str], None],
) -> None:
    settings = load_settings(
        listen="127.0.0.1:0",
        judge={"url": judge.url, "max_retry_sleep_s": 1.0},
        genrm_parse_retries=cfg.parse_retries,
        genrm_parse_retry_sleep_s=cfg.retry_sleep_s,
        cohort_collection_timeout_s=cfg.collection_timeout_s,
        cohort_evaluation_timeout_s=cfg.evaluation_timeout_s,
        judge_request_timeout_s=cfg.judge_request_timeout_s,
        max_terminal_cohorts=cfg.max_terminal_cohorts,
        shutdown_grace_s=5.0,
        judge_outage_tolerance_s=cfg.judge_outage_tolerance_s,
        stream_max_buffered_events=cfg.stream_max_buffered_events,
        max_judge_passes_per_cohort=max_passes(cfg.size),
        auth={"tokens_file": str(tokens)},
        # The default kind of store, a fresh file per run: a run never resumes another's.
        store=f"sqlite:///{tempfile.mkdtemp(prefix='genrm-soak-')}/state.sqlite3",
    )
    server = CohortServer(settings)
    port = await server.start()
    # One connection per worker, as collectors run (a local subchannel pool stops equal
    # channels from sharing one connection). A worker's waiting calls stay well below any
    # per-connection stream limit.
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.use_local_subchannel_pool", 1)],
        )
        for _ in range(cfg.concurrency)
    ]
    clients = Clients(
        [pb_grpc.CohortServiceStub(c) for c in channels],
        timeout=cfg.group_timeout_s,
        unread_late_copies=cfg.unread_late_copies,
    )
    # The outage of a restart wave: the judge's down time plus its start-up.
    tolerant = cfg.judge_outage_tolerance_s >= cfg.restart_down_s + 5.0
    scoring = settings  # Settings is the scoring view
    waves = [make_groups(cfg)]
    waves = [waves[0][i : i + cfg.wave] for i in range(0, cfg.groups, cfg.wave)]
    outcomes: collections.Counter[str] = collections.Counter()
    judge_outcomes: collections.Counter[str] = collections.Counter()
    previous_faulty_keys: set[str] = set()
    retained: list[tuple[str, str, list[int]]] = []
    started = time.perf_counter()

    under_way = asyncio.Event()

    async def worker(number: int, queue: collections.deque[Group]) -> None:
        while queue:
            g = queue.popleft()
            g.worker = number
            try:
                async with asyncio.timeout(cfg.group_timeout_s):
                    await play(clients, g)
            except (TimeoutError, StreamBroken) as exc:
                g.violation(f"scenario did not finish: {exc!r}")
            under_way.set()

    async def crash_judge() -> dict[str, Any]:
        """Once the first group of the wave is done, kill the judge and start it again."""
        await under_way.wait()
        before = await judge.stats()
        await judge.restart(cfg.restart_down_s)
        return before

    try:
        for number, wave in enumerate(waves):
            kind = wave[0].kind
            faulty = kind != "clean"
            await judge.set_faults(faults_for(kind, cfg))
            await judge.reset_stats()
            calls_before = server.runtime.judge_calls
            queue = collections.deque(wave)
            under_way.clear()
            crash = asyncio.create_task(crash_judge()) if kind == "restart" else None
            try:
                await asyncio.gather(*(worker(w, queue) for w in range(cfg.concurrency)))
            finally:
                before = await crash if crash is not None else None
            await server.runtime.drain_tasks()  # cancelled judge calls of masked groups
            stats = await judge.stats()
            pairs: dict[str, int] = collections.Counter(stats["pairs"])
            judge_outcomes.update(stats["by_outcome"])
            report.judge_requests += stats["total"]
            if before is not None:
                pairs.update(before["pairs"])
                judge_outcomes.update(before["by_outcome"])
                report.judge_requests += before["total"]
            comparisons = 0
            wave_keys: set[str] = set()
            played = [x for g in wave for x in (g, *g.twins)]
            for g in played:
                check_group(g, scoring, cfg.parse_retries, tolerant)
                comparisons += check_judge_counts(
                    g, pairs, cfg.parse_retries, cfg.judge_outage_tolerance_s > 0
                )
                for attempt, present in g.present.items():
                    wave_keys.update(g.pair_keys(attempt, present))
                for s in g.subs:
                    outcomes[
                        s.expect.label()
                        if s.outcome and s.expect.accepts(s.outcome)
                        else "UNEXPECTED"
                    ] += 1
                report.submissions += len(g.subs)
                report.scenarios[g.scenario] = report.scenarios.get(g.scenario, 0) + 1
                report.transports[g.transport] = report.transports.get(g.transport, 0) + 1
                report.faulty_groups += g.faulty
                report.wave_kinds[kind] = report.wave_kinds.get(kind, 0) + 1
                report.twin_groups += g.principal != "a"
                if g.scenario == "unread":
                    report.unread_groups += 1
                if not g.complete:
                    report.failed_groups += 1
                elif g.masked:
                    report.masked_groups += 1
                    report.masked_by_kind[kind] = report.masked_by_kind.get(kind, 0) + 1
                elif g.masked is False:
                    report.rewarded_groups += 1
                    report.rewarded_by_kind[kind] = report.rewarded_by_kind.get(kind, 0) + 1
                report.violation_count += len(g.violations)
                report.violations.extend(g.violations[: max(0, 50 - len(report.violations))])
                # Keep the driver's memory flat: this group is checked.
                g.subs, g.answers, g.twins = [], {}, []
            report.judge_comparisons += comparisons
            strays = {k: c for k, c in pairs.items() if k not in wave_keys}
            report.straggler_requests += sum(strays.values())
            unknown = set(strays) - previous_faulty_keys
            if unknown:
                report.violation_count += 1
                report.violations.append(
                    f"wave {number}: judge requests for unknown pairs {unknown}"
                )
            if not faulty:
                delta = server.runtime.judge_calls - calls_before
                if delta != comparisons:
                    report.violation_count += 1
                    report.violations.append(
                        f"wave {number}: runtime made {delta} judge calls, ideal {comparisons}"
                    )
            previous_faulty_keys = wave_keys if faulty else set()
            report.groups += len(wave)
            retained = [(g.gid, g.principal, sorted(g.present)) for g in played]
            del played
            waves[number] = []
            if number + 1 == cfg.warmup_waves:
                report.rss_baseline_kib = settled_rss_kib()
            progress(
                f"wave {number + 1}/{len(waves)} ({kind}): "
                f"{report.groups} groups, {time.perf_counter() - started:.1f}s, "
                f"{report.violation_count} violations, RSS {rss_kib()} KiB"
            )
        report.seconds = time.perf_counter() - started
        await server.runtime.drain_tasks()
        report.runtime_stats = server.runtime.stats()
        census = await server.runtime.refresh_census()
        report.store_counts = {
            "active_cohorts": census.collecting + census.evaluating,
            "tombstones": census.tombstones,
            "watermarks": census.watermarks,
        }
        for gid, principal, attempts in retained:
            for attempt in attempts:
                key = cohort_model.CohortKey(gid, None, attempt, principal)
                held = await server.runtime.shared.load(key)
                found = [t.tombstone for t in held.recovered.tombstones if t.tombstone.key == key]
                if not found:
                    continue
                tomb = found[0]
                report.tombstones_checked += 1
                leaked = [s for s in walk_strings(tomb) if MARKER in s]
                if leaked:
                    report.violation_count += 1
                    report.violations.append(
                        f"tombstone {tomb.key} holds answer text {leaked[0]!r}"
                    )
        del waves, retained
        # grpc.aio's server loop keeps the state of the most recent RPC (and with it the
        # traceback of an abort, whose frame holds that request) until the next RPC
        # arrives: one bounded reference, not a leak. A health check replaces it.
        await HealthStub(channels[0]).Check(HealthCheckRequest(), timeout=10)
        gc.collect()
        tracked = (
            cohort_model.Member,
            cohort_model.CandidateSpec,
            cohort_model.Submission,
            cohort_model.Cohort,
        )
        counts = collections.Counter(
            type(o).__name__ for o in gc.get_objects() if isinstance(o, tracked)
        )
        report.leftover_objects = {t.__name__: counts.get(t.__name__, 0) for t in tracked}
        report.rss_end_kib = settled_rss_kib()
        if not report.rss_baseline_kib:
            report.rss_baseline_kib = report.rss_end_kib
    finally:
        for channel in channels:
            await channel.close(None)
        await server.stop()
    report.rss_peak_kib = _peak_rss_kib()
    report.transport_retries = clients.transport_retries
    report.judge_restarts = judge.restarts
    judged = report.masked_groups + report.rewarded_groups
    report.masked_share = report.masked_groups / judged if judged else 0.0
    report.outcomes = dict(sorted(outcomes.items()))
    report.judge_outcomes = dict(sorted(judge_outcomes.items()))


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.driver", description=__doc__)
    defaults = SoakConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--json", default=None, help="also write the report as JSON here")
    parser.add_argument(
        "--compare-tolerance",
        type=float,
        default=None,
        metavar="SECONDS",
        help="run the same seeded soak twice, with judge_outage_tolerance_s 0 and SECONDS, "
        "and report the masked share of each",
    )
    args = parser.parse_args(argv)
    cfg = SoakConfig(**{k: getattr(args, k) for k in asdict(defaults)})

    def say(line: str) -> None:
        print(line, flush=True)

    if args.compare_tolerance is None:
        report = asyncio.run(run_soak(cfg, progress=say))
        print(report.summary(), flush=True)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(report_json(report), out, indent=2)
        return 1 if report.failures() else 0
    runs = compare_tolerance(cfg, args.compare_tolerance, progress=say)
    print(comparison_summary(runs), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(comparison_json(runs), out, indent=2)
    return 1 if any(r.failures() for r in runs) else 0


def report_json(report: SoakReport) -> dict[str, Any]:
    return {**asdict(report), "failures": report.failures()}


def compare_tolerance(
    cfg: SoakConfig, tolerance_s: float, *, progress: Callable[[str], None]
) -> list[SoakReport]:
    """The same seeded soak (same groups, same judge fault sequence per wave) without and
    with ``judge_outage_tolerance_s``."""
    runs = []
    for value in (0.0, tolerance_s):
        progress(f"--- judge_outage_tolerance_s={value:g}")
        run = asyncio.run(run_soak(replace(cfg, judge_outage_tolerance_s=value), progress=progress))
        progress(run.summary())
        runs.append(run)
    return runs


def comparison_summary(runs: Sequence[SoakReport]) -> str:
    lines = ["masked share (masked / judged groups) under the same faults:"]
    for r in runs:
        tol = r.config["judge_outage_tolerance_s"]
        lines.append(
            f"  judge_outage_tolerance_s={tol:g}: {r.masked_share:.2%} "
            f"({r.masked_groups} of {r.masked_groups + r.rewarded_groups}); by wave kind "
            f"{r.masked_by_kind}; {'PASS' if not r.failures() else 'FAIL'}"
        )
    return "\n".join(lines)


def comparison_json(runs: Sequence[SoakReport]) -> dict[str, Any]:
    return {
        "masked_share": {f"{r.config['judge_outage_tolerance_s']:g}": r.masked_share for r in runs},
        "runs": [report_json(r) for r in runs],
    }


if __name__ == "__main__":
    sys.exit(main())
