"""The fake judge's configuration, fault injection and request counters.

Faults
------
Each judge request draws, from one ``random.Random(seed)`` under a lock, a latency and
one uniform number per fault kind, always in the same order, so a given seed and request
order reproduce the same sequence of faults. Fault kinds in precedence order (the first
that fires wins): ``hang`` (never answer until the server stops), ``reset`` (abort the TCP
connection: SO_LINGER 0, then close), ``truncate`` (headers with the full
Content-Length, then half the body, then close), ``fail_400``, ``fail_503``, ``fail_429``
(with ``Retry-After`` when ``retry_after_s`` is set; whole seconds, rounded up),
``invalid_json`` (a 200 whose body is not JSON), ``budget_exhaust`` (``status:
incomplete`` with ``incomplete_details.reason = max_output_tokens`` and partial text; in
chat: ``finish_reason: length``), ``empty`` (a completed answer with no text),
``malformed`` (a completed answer in prose without any JSON verdict) and ``adversarial``
(a completed answer built to make a verdict parser slow; see below). The ``adversarial``
draw comes from a second stream seeded from the same seed, so adding it left the fault
sequence of every existing seed unchanged.

Adversarial answers carry no verdict; they are ``adversarial_chars`` characters
(default 65,536) of one of these kinds (``adversarial_kind``; ``cycle``, the default,
takes them in turn by request number):

* ``unclosed_fence`` — ```` ```json ```` followed by spaces and no closing fence (cubic
  for a backtracking ```` ```json\\s*([\\s\\S]*?)\\s*``` ```` regex);
* ``open_braces`` — a run of ``{`` that never closes (quadratic for a brace scan that
  restarts at every ``{``);
* ``brace_quotes`` — ``{"`` repeated (every other brace sits inside a string);
* ``nested_quotes`` — ``{"\\"{`` repeated (escaped quotes inside strings that open
  braces).

Each kind has a rate in [0, 1] (``--fail-503-rate``) and a deterministic ``first_n``
(``--fail-503-first-n``): the first N requests *of each answer pair* get that fault.
``first_n`` faults are checked before the random ones. With ``--model`` set, a request
naming another model gets 404 (as vLLM answers) before any fault is considered. Latency is a spec in
milliseconds: ``N`` (fixed), ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA``
(``MEDIAN * exp(SIGMA * z)`` with z standard normal). Rates, first-n counts, latency and
``retry_after_s`` can be changed at runtime with ``POST /faults`` (a JSON object of
``FakeJudgeConfig`` field names) or ``FakeJudgeServer.set_faults``.

Counters

Counters
--------
fault kind, ``bad_request``, ``model_not_found``) and ``pairs`` keyed by
``pair_key(response_1, response_2)`` (the first 16 hex digits of
``sha256(response_1 + "\\0" + response_2)``). ``last_authorization`` and a summary of the
last request are kept for tests. ``GET /stats`` returns them; ``POST /stats/reset`` zeroes
them (which also restarts every pair's ``first_n`` count).
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from genrm_grpc.testing.heuristic import pair_key
from genrm_grpc.testing.node import Node, NodeConfig

FAULT_KINDS: tuple[str, ...] = (
    "hang",
    "reset",
    "truncate",
    "fail_400",
    "fail_503",
    "fail_429",
    "invalid_json",
    "budget_exhaust",
    "empty",
    "malformed",
    "adversarial",
)
"""Fault kinds in precedence order: when several fire for one request, the first wins."""

FAULT_HELP = {
    "hang": "accept the request and never answer until the server stops",
    "reset": "abort the TCP connection (SO_LINGER 0, close) without a response",
    "truncate": "send headers with the full Content-Length, then half the body, then close",
    "fail_400": "answer HTTP 400 (not retryable)",
    "fail_503": "answer HTTP 503",
    "fail_429": "answer HTTP 429 with Retry-After (see --retry-after-s)",
    "invalid_json": "answer HTTP 200 with a body that is not JSON",
    "budget_exhaust": "answer an incomplete (max_output_tokens) / finish_reason=length answer",
    "empty": "answer a completed answer with empty text",
    "malformed": "answer a completed answer in prose without a JSON verdict",
    "adversarial": "answer a completed answer built to slow a verdict parser down "
    "(see --adversarial-kind, --adversarial-chars)",
}
_SECOND_STREAM_KINDS = frozenset({"adversarial"})
"""Kinds drawn from the second random stream (added after seeds were in use)."""

ADVERSARIAL_KINDS: tuple[str, ...] = (
    "unclosed_fence",
    "open_braces",
    "brace_quotes",
    "nested_quotes",
)
"""What an ``adversarial`` answer looks like; ``cycle`` takes them in turn."""


def adversarial_text(kind: str, chars: int, sequence: int = 1) -> str:
    """An answer of ``chars`` characters of the given kind (``cycle``: by ``sequence``)."""
    if kind == "cycle":
        kind = ADVERSARIAL_KINDS[(sequence - 1) % len(ADVERSARIAL_KINDS)]
    if kind == "unclosed_fence":
        unit = "```json" + " " * max(0, chars - 7)
    elif kind == "open_braces":
        unit = "{"
    elif kind == "brace_quotes":
        unit = '{"'
    elif kind == "nested_quotes":
        unit = '{"\\"{'
    else:
        raise ValueError(f"adversarial_kind must be cycle or one of {list(ADVERSARIAL_KINDS)}")
    return (unit * (chars // len(unit) + 1))[:chars]


MALFORMED_TEXT = (
    "Having weighed both answers, response 1 seems a little more helpful than "
    "response 2, though neither is perfect. Scores: undecided."
)
PARTIAL_TEXT = "Let me compare the two responses carefully. Response 1 begins by"


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

DEFAULT_MODEL = "genrm"
"""The model name served when none is configured: ``judge.model``'s default."""


def parse_latency_spec(spec: str) -> Callable[[random.Random], float]:
    """A latency sampler (milliseconds) from ``N``, ``uniform:LO:HI`` or ``lognormal:M:S``."""
    text = spec.strip()
    try:
        if ":" not in text:
            fixed = float(text)
            _check_latency(fixed, spec)
            return lambda _rng: fixed
        kind, *params = text.split(":")
        values = [float(p) for p in params]
        if kind == "uniform" and len(values) == 2:
            low, high = values
            _check_latency(low, spec)
            _check_latency(high, spec)
            if high < low:
                raise ValueError
            return lambda rng: rng.uniform(low, high)
        if kind == "lognormal" and len(values) == 2:
            median, sigma = values
            _check_latency(median, spec)
            _check_latency(sigma, spec)
            return lambda rng: median * math.exp(sigma * rng.gauss(0.0, 1.0))
    except ValueError:
        pass
    raise ValueError(
        f"latency spec {spec!r} must be N, uniform:LO:HI or lognormal:MEDIAN:SIGMA "
        "(milliseconds, finite and >= 0)"
    )


def _check_latency(value: float, spec: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(spec)


@dataclass(frozen=True)
class FakeJudgeConfig:
    """Every knob of the fake judge. Fields ending in ``_rate``/``_first_n`` are faults."""

    host: str = "127.0.0.1"
    port: int = 0
    seed: int = 0
    model: str | None = None
    """When set, requests naming another model get 404 (as vLLM does)."""
    models: tuple[str, ...] = ()
    """Further served model names (``--model`` repeated); listed by ``GET /v1/models``."""
    any_model: bool = False
    """Answer whatever model a request names (the listed names are still listed)."""
    latency_ms: str = "0"
    retry_after_s: float | None = 1.0
    hang_rate: float = 0.0
    hang_first_n: int = 0
    reset_rate: float = 0.0
    reset_first_n: int = 0
    truncate_rate: float = 0.0
    truncate_first_n: int = 0
    fail_400_rate: float = 0.0
    fail_400_first_n: int = 0
    fail_503_rate: float = 0.0
    fail_503_first_n: int = 0
    fail_429_rate: float = 0.0
    fail_429_first_n: int = 0
    invalid_json_rate: float = 0.0
    invalid_json_first_n: int = 0
    budget_exhaust_rate: float = 0.0
    budget_exhaust_first_n: int = 0
    empty_rate: float = 0.0
    empty_first_n: int = 0
    malformed_rate: float = 0.0
    malformed_first_n: int = 0
    adversarial_rate: float = 0.0
    adversarial_first_n: int = 0
    adversarial_kind: str = "cycle"
    adversarial_chars: int = 65536
    node: NodeConfig = dataclasses.field(default_factory=NodeConfig)
    """Farm-node simulation: slots, tokens/s, output lengths, prefix cache, sick mode."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for kind in FAULT_KINDS:
            rate = getattr(self, f"{kind}_rate")
            if isinstance(rate, bool) or not isinstance(rate, int | float):
                raise ValueError(f"{kind}_rate must be a number, got {rate!r}")
            if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
                raise ValueError(f"{kind}_rate must be in [0, 1], got {rate!r}")
            first_n = getattr(self, f"{kind}_first_n")
            if isinstance(first_n, bool) or not isinstance(first_n, int) or first_n < 0:
                raise ValueError(f"{kind}_first_n must be an integer >= 0, got {first_n!r}")
        retry_after = self.retry_after_s
        if retry_after is not None and (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, int | float)
            or not (math.isfinite(retry_after) and retry_after >= 0)
        ):
            raise ValueError(f"retry_after_s must be finite and >= 0, got {retry_after!r}")
        if not isinstance(self.latency_ms, str):
            raise ValueError(f"latency_ms must be a spec string, got {self.latency_ms!r}")
        parse_latency_spec(self.latency_ms)
        if self.adversarial_kind != "cycle" and self.adversarial_kind not in ADVERSARIAL_KINDS:
            raise ValueError(
                f"adversarial_kind must be cycle or one of {list(ADVERSARIAL_KINDS)}, "
                f"got {self.adversarial_kind!r}"
            )
        chars = self.adversarial_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or not 16 <= chars <= 1 << 24:
            raise ValueError(
                f"adversarial_chars must be an integer in [16, 16777216], got {chars!r}"
            )

    def served_models(self) -> tuple[str, ...]:
        """The model names ``GET /v1/models`` lists (``genrm`` when none is configured)."""
        names = tuple(dict.fromkeys([*([self.model] if self.model else []), *self.models]))
        return names or (DEFAULT_MODEL,)

    def checks_model(self) -> bool:
        """Whether a request naming an unserved model gets 404."""
        return not self.any_model and bool(self.model or self.models)

    def faults(self) -> dict[str, Any]:
        """The runtime-adjustable part of the configuration."""
        return {name: getattr(self, name) for name in RUNTIME_FIELDS}


RUNTIME_FIELDS: tuple[str, ...] = (
    "latency_ms",
    "retry_after_s",
    *(f"{kind}_{suffix}" for kind in FAULT_KINDS for suffix in ("rate", "first_n")),
    "adversarial_kind",
    "adversarial_chars",
)
"""Fields that ``POST /faults`` and ``FakeJudgeServer.set_faults`` may change."""


# --------------------------------------------------------------------------------------
# Shared state
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeRequest:
    endpoint: str
    model: str | None
    last_user_turn: str
    response_1: str
    response_2: str
    principle: str | None
    max_tokens: int | None
    roles: tuple[str, ...]
    input_words: int
    messages: tuple[tuple[str, str], ...] = ()
    """Every prompt message as (role, text), in the order the judge would read them."""
    stream: bool = False
    """The request asked for a server-sent-events answer (``"stream": true``)."""
    include_usage: bool = False
    """Chat: ``stream_options.include_usage`` (a last chunk carries the usage)."""


class JudgeState:
    """Counters, fault settings and the random stream, shared by handler threads."""

    def __init__(self, config: FakeJudgeConfig) -> None:
        self.lock = threading.Lock()
        self.counted = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.config = config
        self.latency = parse_latency_spec(config.latency_ms)
        self.models: tuple[str, ...] = config.served_models()
        """Served model names, listed by ``GET /v1/models``; ``POST /control`` may change them."""
        self.check_model = config.checks_model()
        self.node = Node(config.node, config.seed)
        self.rng = random.Random(config.seed)
        self.second_rng = random.Random(f"{config.seed}/second-stream")
        self.total = 0
        self.by_endpoint: Counter[str] = Counter()
        self.by_outcome: Counter[str] = Counter()
        self.pairs: Counter[str] = Counter()
        self.last_authorization: str | None = None
        self.last_request: dict[str, Any] | None = None

    def set_faults(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(changes) - set(RUNTIME_FIELDS))
        if unknown:
            raise ValueError(f"unknown fault settings {unknown}; known: {list(RUNTIME_FIELDS)}")
        with self.lock:
            config = dataclasses.replace(self.config, **changes)
            self.config = config
            self.latency = parse_latency_spec(config.latency_ms)
            return config.faults()

    def control(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a ``POST /control`` body: node fields, ``models``, ``clear_prefix_cache``."""
        changes = dict(changes)
        models = changes.pop("models", None)
        clear = changes.pop("clear_prefix_cache", False)
        if models is not None and (
            not isinstance(models, list)
            or not models
            or not all(isinstance(name, str) and name for name in models)
        ):
            raise ValueError("models must be a non-empty list of model names")
        if not isinstance(clear, bool):
            raise ValueError("clear_prefix_cache must be true or false")
        self.node.control(changes)
        if models is not None:
            with self.lock:
                self.models = tuple(dict.fromkeys(models))
                self.check_model = True
        if clear:
            self.node.clear_prefix_cache()
        return self.control_state()

    def control_state(self) -> dict[str, Any]:
        with self.lock:
            models = list(self.models)
        return {**self.node.control_state(), "models": models}

    def record(self, endpoint: str, outcome: str, authorization: str | None) -> None:
        """Count a request that never got far enough to name a pair."""
        with self.lock:
            self.total += 1
            self.by_endpoint[endpoint] += 1
            self.by_outcome[outcome] += 1
            self.last_authorization = authorization
            self.counted.notify_all()

    def decide(self, request: JudgeRequest, authorization: str | None) -> tuple[str, float, int]:
        """Count the request and choose its fate: (outcome, latency seconds, sequence)."""
        with self.lock:
            config = self.config
            self.total += 1
            self.by_endpoint[request.endpoint] += 1
            key = pair_key(request.response_1, request.response_2)
            self.pairs[key] += 1
            nth_for_pair = self.pairs[key]
            self.last_authorization = authorization
            self.last_request = {
                "endpoint": request.endpoint,
                "model": request.model,
                "roles": list(request.roles),
                "pair": key,
                "principle": request.principle,
                "max_tokens": request.max_tokens,
                "stream": request.stream,
            }
            # Always consume the same number of draws so the sequence depends only on
            # the seed and the request order, not on which faults are switched on.
            latency_s = max(0.0, self.latency(self.rng)) / 1000.0
            draws = [
                (self.second_rng if kind in _SECOND_STREAM_KINDS else self.rng).random()
                for kind in FAULT_KINDS
            ]
            outcome = "ok"
            if self.check_model and request.model not in self.models:
                outcome = "model_not_found"
            else:
                for kind in FAULT_KINDS:
                    if nth_for_pair <= getattr(config, f"{kind}_first_n"):
                        outcome = kind
                        break
                else:
                    for kind, draw in zip(FAULT_KINDS, draws, strict=True):
                        if draw < getattr(config, f"{kind}_rate"):
                            outcome = kind
                            break
            self.by_outcome[outcome] += 1
            self.counted.notify_all()
            return outcome, latency_s, self.total

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "total": self.total,
                "by_endpoint": dict(self.by_endpoint),
                "by_outcome": dict(self.by_outcome),
                "pairs": dict(self.pairs),
                "last_authorization": self.last_authorization,
                "last_request": dict(self.last_request) if self.last_request else None,
                "faults": self.config.faults(),
                "node": self.node.snapshot(),
            }

    def reset(self) -> None:
        with self.lock:
            self.total = 0
            self.by_endpoint.clear()
            self.by_outcome.clear()
            self.pairs.clear()
            self.last_authorization = None
            self.last_request = None
        self.node.reset()
