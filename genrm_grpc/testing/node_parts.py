"""The parts a fake judge node is built from: output lengths, prompt tokens, the prefix
cache, tickets and the close watcher (``genrm_grpc.testing.node`` puts them together
and re-exports them; its docstring describes the simulation). A TEST DOUBLE: every
figure is simulated.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import select
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_BUDGET = 16384
"""The budget ``budget`` means when a request names no max tokens."""


# --------------------------------------------------------------------------------------
# Output length
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputTokens:
    """A distribution of answer lengths in tokens, parsed from a spec string."""

    spec: str
    sample: Callable[[random.Random, int | None], int]

    @classmethod
    def parse(cls, spec: str) -> OutputTokens:
        """``N``, ``uniform:LO:HI`` or ``bimodal:A:B:P[:J]`` (``B`` may be ``budget``)."""
        text = spec.strip()
        try:
            if ":" not in text:
                fixed = _tokens(text)
                return cls(spec, lambda _rng, _budget: fixed)
            kind, *params = text.split(":")
            if kind == "uniform" and len(params) == 2:
                low, high = _tokens(params[0]), _tokens(params[1])
                if high < low:
                    raise ValueError
                return cls(spec, lambda rng, _budget: rng.randint(low, high))
            if kind == "bimodal" and len(params) in (3, 4):
                converge = _tokens(params[0])
                runaway = None if params[1] == "budget" else _tokens(params[1])
                probability = float(params[2])
                jitter = _tokens(params[3]) if len(params) == 4 else 0
                if not 0.0 <= probability <= 1.0 or jitter > converge:
                    raise ValueError

                def bimodal(rng: random.Random, budget: int | None) -> int:
                    # Two draws per request whatever the outcome, so the sequence of
                    # lengths depends only on the seed and the request order.
                    runs_away = rng.random() < probability
                    spread = rng.uniform(-jitter, jitter)
                    if runs_away:
                        return runaway if runaway is not None else budget or DEFAULT_BUDGET
                    return max(1, round(converge + spread))

                return cls(spec, bimodal)
        except ValueError:
            pass
        raise ValueError(
            f"output-tokens spec {spec!r} must be N, uniform:LO:HI or bimodal:A:B:P[:J] "
            "(tokens >= 1, B may be 'budget', 0 <= P <= 1, J <= A)"
        )


def _tokens(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


# --------------------------------------------------------------------------------------
# Prefix cache
# --------------------------------------------------------------------------------------


def prompt_tokens(messages: Sequence[tuple[str, str]]) -> list[str]:
    """The simulated tokens of a prompt: per message ``<role>`` then its whitespace words."""
    tokens: list[str] = []
    for role, text in messages:
        tokens.append(f"<{role}>")
        tokens.extend(text.split())
    return tokens


class PrefixCache:
    """An LRU of hash-chained full token blocks (a model of vLLM's prefix caching)."""

    def __init__(self, block_tokens: int, capacity_blocks: int) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()

    def lookup_and_insert(self, tokens: Sequence[str]) -> int:
        """Cached tokens of this prompt (its leading blocks seen recently); then remember
        every full block of it. At least one token is always computed, as in vLLM."""
        if self.capacity_blocks <= 0:
            return 0
        size = self.block_tokens
        usable = max(0, len(tokens) - 1) // size
        digests: list[bytes] = []
        previous = b""
        for index in range(len(tokens) // size):
            block = "\x1f".join(tokens[index * size : (index + 1) * size]).encode()
            previous = hashlib.blake2b(previous + block, digest_size=16).digest()
            digests.append(previous)
        hits = 0
        for digest in digests[:usable]:
            if digest not in self._blocks:
                break
            hits += 1
        for digest in digests:
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return hits * size


# --------------------------------------------------------------------------------------
# Client-close watcher
# --------------------------------------------------------------------------------------


class Ticket:
    """One judge request on the node: what wakes its handler thread, and why."""

    __slots__ = ("aborted", "granted", "planned_blocks", "stopped", "wake")

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.aborted = False
        self.granted = False
        self.stopped = False
        self.planned_blocks = 0

    @property
    def done(self) -> bool:
        return self.aborted or self.stopped


class CloseWatcher:
    """One thread waiting in ``epoll`` for peers that hang up on registered sockets."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._lock = threading.Lock()
        self._tickets: dict[int, Ticket] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._epoll.register(self._wake_r.fileno(), select.EPOLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fake-judge:watch", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, ticket: Ticket) -> bool:
        fd = sock.fileno()
        with self._lock:
            if self._closed or fd < 0:
                return False
            self._tickets[fd] = ticket
            try:
                # Edge of the peer's FIN/RST only: data the client sends (it sends none
                # before our answer) would not wake this thread.
                self._epoll.register(fd, select.EPOLLRDHUP | select.EPOLLONESHOT)
            except OSError:
                self._tickets.pop(fd, None)
                return False
        return True

    def unwatch(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        with self._lock:
            if self._tickets.pop(fd, None) is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        self._epoll.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        wake_fd = self._wake_r.fileno()
        while True:
            try:
                events = self._epoll.poll()
            except OSError:
                return
            for fd, _mask in events:
                if fd == wake_fd:
                    return
                with self._lock:
                    ticket = self._tickets.pop(fd, None)
                    with contextlib.suppress(OSError, ValueError):
                        self._epoll.unregister(fd)
                if ticket is not None:
                    ticket.aborted = True
                    ticket.wake.set()
