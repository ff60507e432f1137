"""The fake judge as a farm node: slots, simulated generation time, a prefix cache.

A TEST DOUBLE of a vLLM replica's *scheduling*, not of a model: every duration, token
count and cache figure here is simulated. See ``docs/fake-judge.md``.

* **Slots** — at most ``slots`` requests generate at once; the rest wait first come,
  first served, as vLLM's continuous batching admits up to ``max_num_seqs``.
* **Time** — a request in a slot takes ``prefill_ms_per_token`` per *uncached* prompt
  token plus ``output_tokens / tokens_per_s``, times ``time_scale`` (times
  ``slow_factor`` plus ``slow_ms`` in ``slow`` mode). Waiting is ``Event.wait`` with a
  timeout: no thread spins.
* **Output length** — ``OutputTokens``: ``N``, ``uniform:LO:HI`` or
  ``bimodal:A:B:P[:J]`` (A ± J tokens, or with probability P, B tokens; ``B`` may be
  ``budget``, the request's own token budget). A length at or past the budget is cut
  there and answered as a real judge would: ``finish_reason: length`` /
  ``status: incomplete``.
* **Prefix cache** — a prompt is tokens (whitespace words, each message led by a
  ``<role>`` token); full blocks of ``block_tokens`` are chained by hash, as vLLM's
  automatic prefix caching keys KV blocks; an LRU of ``capacity_blocks`` remembers them.
  Leading blocks found there are cached tokens and cost no prefill.
* **Aborts** — a client that closes its connection while its request waits or
  generates is noticed at once (an epoll watcher thread on the sockets), the request is
  counted as aborted, its slot is freed and its generation stops.
* **Streaming** — a streamed request's tokens are emitted over its simulated decode
  time (``generate`` with ``emit``): token k of n goes out at prefill + k/n × decode, in
  one write per ``TICK_S``; a write the client no longer reads counts as an abort.
"""

from __future__ import annotations

import dataclasses
import math
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genrm_grpc.testing.node_metrics import vllm_metrics_text
from genrm_grpc.testing.node_parts import (
    DEFAULT_BUDGET,
    CloseWatcher,
    OutputTokens,
    PrefixCache,
    Ticket,
    prompt_tokens,
)

__all__ = [
    "DEFAULT_BUDGET",
    "HEALTH_CHOICES",
    "MODES",
    "TICK_S",
    "CloseWatcher",
    "Node",
    "NodeConfig",
    "OutputTokens",
    "Plan",
    "PrefixCache",
    "Ticket",
    "prompt_tokens",
]

MODES: tuple[str, ...] = ("ok", "hang", "503", "slow", "stall")
"""Sick modes: ``ok``; ``hang`` (accept, never answer); ``503`` (refuse); ``slow``;
``stall`` (accept, and to a streamed request answer HTTP 200 and the stream's opening
event, then never a token: a hung engine behind a live HTTP front end)."""

TICK_S = 0.02
"""A streamed answer's tokens go out in one write per tick (or per token, if slower)."""
HEALTH_CHOICES: tuple[str, ...] = ("auto", "ok", "503", "hang")


# --------------------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeConfig:
    """The farm-node knobs of the fake judge (all simulated; see the module docstring)."""

    slots: int = 0
    """At most this many requests generate at once; 0 = no limit, no queue."""
    tokens_per_s: float = 0.0
    """Decode speed of one request; 0 = generation takes no time."""
    output_tokens: str | None = None
    """Length spec; ``None`` = the answer's own word count."""
    prefill_ms_per_token: float = 0.0
    prefix_block_tokens: int = 16
    prefix_cache_blocks: int = 8192
    kv_cache_blocks: int = 65536
    time_scale: float = 1.0
    mode: str = "ok"
    slow_factor: float = 10.0
    slow_ms: float = 1000.0
    health: str = "auto"

    def __post_init__(self) -> None:
        _check_int("slots", self.slots, 0)
        _check_number("tokens_per_s", self.tokens_per_s)
        _check_number("prefill_ms_per_token", self.prefill_ms_per_token)
        _check_int("prefix_block_tokens", self.prefix_block_tokens, 1)
        _check_int("prefix_cache_blocks", self.prefix_cache_blocks, 0)
        _check_int("kv_cache_blocks", self.kv_cache_blocks, 1)
        _check_number("time_scale", self.time_scale)
        _check_number("slow_factor", self.slow_factor)
        _check_number("slow_ms", self.slow_ms)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.health not in HEALTH_CHOICES:
            raise ValueError(f"health must be one of {list(HEALTH_CHOICES)}, got {self.health!r}")
        if self.output_tokens is not None:
            OutputTokens.parse(self.output_tokens)


CONTROL_FIELDS: tuple[str, ...] = (
    "mode",
    "health",
    "slots",
    "tokens_per_s",
    "slow_factor",
    "slow_ms",
    "time_scale",
    "prefill_ms_per_token",
    "output_tokens",
)
"""``NodeConfig`` fields ``POST /control`` may change (besides ``models`` and
``clear_prefix_cache``)."""


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_number(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


COUNTERS: tuple[str, ...] = (
    "requests",
    "completed",
    "aborted",
    "aborted_waiting",
    "aborted_running",
    "hung",
    "rejected_503",
    "prompt_tokens",
    "cached_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "finished_stop",
    "finished_length",
    "slot_ms",
    "slot_ms_completed",
)
WAITABLE: tuple[str, ...] = (*COUNTERS, "running", "waiting", "max_running")


@dataclass
class Plan:
    """What the node decided for one request once it has a slot."""

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int | None
    """Simulated answer length (``None``: the answer's own word count)."""
    truncated: bool
    """The length reached the request's budget: answer as cut at ``max_tokens``."""


class Node:
    """Slots, queue, prefix cache, sick mode and counters of one fake-judge node."""

    def __init__(self, config: NodeConfig, seed: int) -> None:
        self.config = config
        self._lengths = OutputTokens.parse(config.output_tokens) if config.output_tokens else None
        self._rng = random.Random(f"{seed}/node-lengths")
        self.cache = PrefixCache(config.prefix_block_tokens, config.prefix_cache_blocks)
        self.cond = threading.Condition()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.running = 0
        self.max_running = 0
        self._running_blocks = 0
        self._queue: deque[Ticket] = deque()
        self._active: set[Ticket] = set()
        self.stopping = False
        self.watcher: CloseWatcher | None = None

    # -- control --------------------------------------------------------------------

    def control(self, changes: Mapping[str, Any]) -> None:
        unknown = sorted(set(changes) - set(CONTROL_FIELDS))
        if unknown:
            raise ValueError(f"unknown control fields {unknown}; known: {list(CONTROL_FIELDS)}")
        with self.cond:
            config = dataclasses.replace(self.config, **changes)
            self.config = config
            if "output_tokens" in changes:
                spec = config.output_tokens
                self._lengths = OutputTokens.parse(spec) if spec else None
            self._grant_locked()

    def control_state(self) -> dict[str, Any]:
        with self.cond:
            return {name: getattr(self.config, name) for name in CONTROL_FIELDS}

    @property
    def mode(self) -> str:
        return self.config.mode

    def health(self) -> str:
        """What ``/health`` does now: ``ok``, ``503`` or ``hang``."""
        config = self.config
        if config.health != "auto":
            return config.health
        return "503" if config.mode == "503" else "ok"

    # -- one request ----------------------------------------------------------------

    def admit(self, sock: socket.socket | None, *, count: bool = True) -> Ticket:
        """Count an arriving request and watch its connection for a hang-up."""
        ticket = Ticket()
        with self.cond:
            self.counters["requests"] += int(count)
            self._active.add(ticket)
            if self.stopping:
                ticket.stopped = True
            self.cond.notify_all()
        watcher = self.watcher
        if sock is not None and watcher is not None:
            watcher.watch(sock, ticket)
        return ticket

    def release(self, ticket: Ticket, sock: socket.socket | None) -> None:
        """The handler is done with its request (answered, aborted or stopped)."""
        watcher = self.watcher
        if sock is not None and watcher is not None:
            watcher.unwatch(sock)
        with self.cond:
            self._active.discard(ticket)
            self._free_locked(ticket)
            self.cond.notify_all()

    def _free_locked(self, ticket: Ticket) -> None:
        """Give up the ticket's slot (or its place in the queue); idempotent."""
        if ticket.granted:
            ticket.granted = False
            self.running -= 1
            self._running_blocks -= ticket.planned_blocks
            self._grant_locked()
        elif ticket in self._queue:
            self._queue.remove(ticket)

    def count(self, name: str, amount: int = 1) -> None:
        with self.cond:
            self.counters[name] += amount
            self.cond.notify_all()

    def wait(self, ticket: Ticket, seconds: float) -> bool:
        """Sleep ``seconds`` of real time unless aborted or stopped; True if undisturbed."""
        deadline = time.monotonic() + seconds
        while not ticket.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            ticket.wake.wait(remaining)
            ticket.wake.clear()
        return False

    def hang(self, ticket: Ticket) -> None:
        """Never answer: return once the client hangs up or the server stops."""
        self.count("hung")
        while not ticket.done:
            ticket.wake.wait()
            ticket.wake.clear()
        self._count_abort(ticket, "aborted_running")

    def acquire(self, ticket: Ticket) -> bool:
        """Wait (FIFO) for a slot; False if the client hung up or the server stopped."""
        with self.cond:
            self._queue.append(ticket)
            self._grant_locked()
            self.cond.notify_all()
        while not ticket.granted and not ticket.done:
            ticket.wake.wait()
            ticket.wake.clear()
        if ticket.granted and not ticket.done:
            return True
        self._count_abort(ticket, "aborted_running" if ticket.granted else "aborted_waiting")
        return False

    def plan(self, ticket: Ticket, tokens: Sequence[str], budget: int | None) -> Plan:
        """In a slot: look the prompt up in the prefix cache and draw the answer length."""
        with self.cond:
            cached = self.cache.lookup_and_insert(tokens)
            length = None if self._lengths is None else self._lengths.sample(self._rng, budget)
            truncated = length is not None and budget is not None and length >= budget
            if truncated and budget is not None:
                length = budget
            counters = self.counters
            counters["prompt_tokens"] += len(tokens)
            counters["cached_tokens"] += cached
            counters["prefix_cache_queries"] += len(tokens)
            counters["prefix_cache_hits"] += cached
            block = self.config.prefix_block_tokens
            blocks = math.ceil((len(tokens) + (length or 0)) / block)
            ticket.planned_blocks = blocks
            self._running_blocks += blocks
            self.cond.notify_all()
        return Plan(len(tokens), cached, length, truncated)

    def generation_s(self, plan: Plan) -> tuple[float, float]:
        """(prefill seconds, decode seconds) of a planned request, mode included."""
        config = self.config
        prefill = (plan.prompt_tokens - plan.cached_tokens) * config.prefill_ms_per_token / 1e3
        decode = 0.0
        if plan.output_tokens is not None and config.tokens_per_s > 0:
            decode = plan.output_tokens / config.tokens_per_s
        scale = config.time_scale
        if config.mode == "slow":
            scale *= config.slow_factor
        return prefill * scale, decode * scale

    def generate(
        self,
        ticket: Ticket,
        plan: Plan,
        answer_tokens: int,
        emit: Callable[[int], bool] | None = None,
    ) -> bool:
        """Spend the simulated time of the request; count the tokens it produced.

        With ``emit`` (a streamed answer), ``emit(k)`` sends the next ``k`` tokens as
        they fall due and returns False when the client is gone (counted as an abort)."""
        prefill_s, decode_s = self.generation_s(plan)
        if self.config.mode == "slow":
            prefill_s += self.config.slow_ms / 1e3
        started = time.monotonic()
        if emit is None:
            finished = self.wait(ticket, prefill_s + decode_s)
        else:
            finished = self._stream(ticket, prefill_s, decode_s, answer_tokens, emit)
        held_ms = round(1000 * ((prefill_s + decode_s) if finished else time.monotonic() - started))
        if finished:
            produced = answer_tokens
        else:
            elapsed = time.monotonic() - started - prefill_s
            produced = 0 if decode_s <= 0 else int(answer_tokens * max(0.0, elapsed) / decode_s)
            self._count_abort(ticket, "aborted_running")
        with self.cond:
            self.counters["generation_tokens"] += min(produced, answer_tokens)
            self.counters["slot_ms"] += held_ms
            if finished:
                self.counters["slot_ms_completed"] += held_ms
                self.counters["completed"] += 1
                self.counters["finished_length" if plan.truncated else "finished_stop"] += 1
            self.cond.notify_all()
        return finished

    def _stream(
        self,
        ticket: Ticket,
        prefill_s: float,
        decode_s: float,
        tokens: int,
        emit: Callable[[int], bool],
    ) -> bool:
        """Emit ``tokens`` over ``decode_s`` after ``prefill_s``; False if cut short."""
        if not self.wait(ticket, prefill_s):
            return False
        begun = time.monotonic()
        sent = 0
        while sent < tokens:
            elapsed = time.monotonic() - begun
            due = tokens if decode_s <= 0 else min(tokens, int(tokens * elapsed / decode_s))
            if due > sent:
                if not emit(due - sent):
                    ticket.aborted = True  # the client stopped reading: it hung up
                    return False
                sent = due
                continue
            # The next token falls due at begun + (sent + 1) / tokens × decode_s.
            pause = max(TICK_S, begun + (sent + 1) * decode_s / tokens - time.monotonic())
            if not self.wait(ticket, pause):
                return False
        return not ticket.done

    def _count_abort(self, ticket: Ticket, where: str) -> None:
        # The abort and the freed slot in one step: no reader of the counters sees an
        # aborted request still running (release() later finds the slot already free).
        if ticket.aborted:
            with self.cond:
                self.counters["aborted"] += 1
                self.counters[where] += 1
                self._free_locked(ticket)
                self.cond.notify_all()

    def _grant_locked(self) -> None:
        limit = self.config.slots
        while self._queue and (limit <= 0 or self.running < limit):
            ticket = self._queue.popleft()
            if ticket.done:
                ticket.wake.set()
                continue
            ticket.granted = True
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            ticket.wake.set()

    # -- counters -------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> dict[str, Any]:
        return {
            **self.counters,
            "running": self.running,
            "waiting": len(self._queue),
            "max_running": self.max_running,
            "kv_cache_usage": self._kv_usage_locked(),
            "prefix_cache_blocks": len(self.cache),
            "mode": self.config.mode,
            "slots": self.config.slots,
            "simulated": True,
        }

    def _kv_usage_locked(self) -> float:
        return min(1.0, max(0, self._running_blocks) / self.config.kv_cache_blocks)

    def wait_for(self, targets: Mapping[str, int], timeout: float) -> tuple[bool, dict[str, Any]]:
        """Block until every named counter is >= its target (for deterministic tests)."""
        unknown = sorted(set(targets) - set(WAITABLE))
        if unknown:
            raise ValueError(f"unknown counters {unknown}; known: {list(WAITABLE)}")

        def reached() -> bool:
            now = self._snapshot_locked()
            return self.stopping or all(now[name] >= value for name, value in targets.items())

        with self.cond:
            met = self.cond.wait_for(reached, timeout)
            return bool(met) and not self.stopping, self._snapshot_locked()

    def reset(self) -> None:
        with self.cond:
            self.counters = dict.fromkeys(COUNTERS, 0)
            self.max_running = self.running
            self.cond.notify_all()

    def clear_prefix_cache(self) -> None:
        with self.cond:
            self.cache.clear()

    def stop(self) -> None:
        """Wake every waiting, generating or hung request: the server is stopping."""
        with self.cond:
            self.stopping = True
            for ticket in self._active:
                ticket.stopped = True
                ticket.wake.set()
            self.cond.notify_all()

    def start(self) -> None:
        with self.cond:
            self.stopping = False
        if self.watcher is None:
            self.watcher = CloseWatcher()

    def close(self) -> None:
        self.stop()
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.close()

    # -- /metrics -------------------------------------------------------------------

    def metrics_text(self, model: str) -> str:
        """Prometheus text under vLLM's metric names (every value simulated)."""
        with self.cond:
            counters = dict(self.counters)
            running, waiting = self.running, len(self._queue)
            usage = self._kv_usage_locked()
        return vllm_metrics_text(model, counters, running, waiting, usage)
