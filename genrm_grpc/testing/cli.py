"""``genrm-grpc fake-judge``: the fake judge (a test double) as a process of its own.

Also runnable as ``python -m genrm_grpc.testing.cli``. It prints
``fake-judge listening on URL`` once it serves, then runs until SIGTERM or SIGINT. It
listens on port 8000 by default, the port ``judge.url`` names by default; a port already
in use is one line on stderr and exit status 2.

``_build_parser`` is over 60 lines and stays whole: it is a flat table of the fake
judge's options (one ``add_argument`` per fault, latency and node knob, in the order
``--help`` lists them), and cutting it into pieces would only scatter that table.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import threading
from types import FrameType
from typing import Any

from genrm_grpc.testing.faults import (
    ADVERSARIAL_KINDS,
    DEFAULT_MODEL,
    FAULT_HELP,
    FAULT_KINDS,
    FakeJudgeConfig,
)
from genrm_grpc.testing.inprocess import FakeJudgeServer
from genrm_grpc.testing.node import HEALTH_CHOICES, MODES, NodeConfig

DEFAULT_PORT = 8000
"""The port ``judge.url`` names by default, so the two meet without flags."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc fake-judge",
        description=(
            "Serve a fake GenRM judge: a deterministic TEST DOUBLE that speaks the "
            "OpenAI-compatible /v1/responses and /v1/chat/completions APIs. It is not a "
            "model: verdicts come from word overlap with the last user turn and answer "
            "length. Faults can be injected to exercise retries and failure handling."
        ),
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="port to bind; 0 picks a free port (default: %(default)s, judge.url's port)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault/latency stream")
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="NAME",
        help=(
            f"a served model name, repeatable (default: {DEFAULT_MODEL}, judge.model's "
            "default); GET /v1/models lists them, requests naming another get HTTP 404"
        ),
    )
    parser.add_argument(
        "--any-model",
        action="store_true",
        help="answer requests naming any model (GET /v1/models still lists --model)",
    )
    parser.add_argument(
        "--latency-ms",
        default="0",
        help="latency per request: N, uniform:LO:HI or lognormal:MEDIAN:SIGMA (ms)",
    )
    parser.add_argument(
        "--retry-after-s",
        type=float,
        default=1.0,
        help="Retry-After seconds sent with injected 429s (negative: omit the header)",
    )
    for kind in FAULT_KINDS:
        flag = kind.replace("_", "-")
        parser.add_argument(
            f"--{flag}-rate", type=float, default=0.0, help=f"probability to {FAULT_HELP[kind]}"
        )
        parser.add_argument(
            f"--{flag}-first-n",
            type=int,
            default=0,
            help=f"{FAULT_HELP[kind]} for the first N requests of each answer pair",
        )
    parser.add_argument(
        "--adversarial-kind",
        default="cycle",
        choices=["cycle", *ADVERSARIAL_KINDS],
        help="shape of adversarial answers; cycle takes them in turn (default: %(default)s)",
    )
    parser.add_argument(
        "--adversarial-chars",
        type=int,
        default=65536,
        help="length of adversarial answers in characters (default: %(default)s)",
    )
    node = parser.add_argument_group(
        "farm node (simulated: slots, generation time, prefix cache, sick modes)"
    )
    node.add_argument(
        "--slots",
        type=int,
        default=0,
        help="at most N requests generating at once, the rest queued first come first "
        "served, as vLLM's max_num_seqs (default: 0 = no limit)",
    )
    node.add_argument(
        "--tokens-per-s",
        type=float,
        default=0.0,
        help="simulated decode speed of one request (default: 0 = generation takes no time)",
    )
    node.add_argument(
        "--output-tokens",
        default=None,
        metavar="SPEC",
        help="simulated answer length: N, uniform:LO:HI or bimodal:A:B:P[:J] (A +- J "
        "tokens, or with probability P, B tokens; B may be 'budget'); a length at the "
        "request's max tokens is cut there (finish_reason length); default: the answer's "
        "own word count",
    )
    node.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=0.0,
        help="simulated prefill time per prompt token not in the prefix cache (default: 0)",
    )
    node.add_argument(
        "--prefix-block-tokens",
        type=int,
        default=16,
        help="prefix-cache block size in tokens (token = whitespace word; default: 16)",
    )
    node.add_argument(
        "--prefix-cache-blocks",
        type=int,
        default=8192,
        help="blocks the prefix-cache LRU remembers (0: no prefix cache; default: 8192)",
    )
    node.add_argument(
        "--kv-cache-blocks",
        type=int,
        default=65536,
        help="simulated KV-cache size behind vllm:kv_cache_usage_perc (default: 65536)",
    )
    node.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every simulated prefill and decode time (0.01 = 100x faster)",
    )
    node.add_argument(
        "--mode",
        default="ok",
        choices=list(MODES),
        help="starting mode: ok, hang (accept, never answer), 503 (refuse), slow, "
        "stall (a streamed request gets HTTP 200 and no token); "
        "POST /control switches it at run time (default: %(default)s)",
    )
    node.add_argument(
        "--slow-factor",
        type=float,
        default=10.0,
        help="in slow mode, simulated time is multiplied by this (default: %(default)s)",
    )
    node.add_argument(
        "--slow-ms",
        type=float,
        default=1000.0,
        help="in slow mode, extra milliseconds per request (default: %(default)s)",
    )
    node.add_argument(
        "--health",
        default="auto",
        choices=list(HEALTH_CHOICES),
        help="GET /health: auto (503 in 503 mode, else 200, as a hung vLLM still "
        "answers 200), ok, 503 or hang (default: %(default)s)",
    )
    return parser


def _config_from_args(args: argparse.Namespace) -> FakeJudgeConfig:
    faults: dict[str, Any] = {}
    for kind in FAULT_KINDS:
        faults[f"{kind}_rate"] = getattr(args, f"{kind}_rate")
        faults[f"{kind}_first_n"] = getattr(args, f"{kind}_first_n")
    return FakeJudgeConfig(
        host=args.host,
        port=args.port,
        seed=args.seed,
        models=tuple(args.model or [DEFAULT_MODEL]),
        any_model=args.any_model,
        latency_ms=args.latency_ms,
        retry_after_s=None if args.retry_after_s < 0 else args.retry_after_s,
        adversarial_kind=args.adversarial_kind,
        adversarial_chars=args.adversarial_chars,
        node=NodeConfig(
            slots=args.slots,
            tokens_per_s=args.tokens_per_s,
            output_tokens=args.output_tokens,
            prefill_ms_per_token=args.prefill_ms_per_token,
            prefix_block_tokens=args.prefix_block_tokens,
            prefix_cache_blocks=args.prefix_cache_blocks,
            kv_cache_blocks=args.kv_cache_blocks,
            time_scale=args.time_scale,
            mode=args.mode,
            slow_factor=args.slow_factor,
            slow_ms=args.slow_ms,
            health=args.health,
        ),
        **faults,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the fake judge until SIGTERM or SIGINT; prints its URL on one line first."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        config = _config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[signal.Signals, Any] = {}
    if in_main_thread:
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        server = FakeJudgeServer(config).start()
    except OSError as exc:
        for restored, handler in previous.items():
            signal.signal(restored, handler)
        reason = exc.strerror or str(exc)
        hint = " (pass --port 0 for any free port)" if exc.errno == errno.EADDRINUSE else ""
        print(
            f"genrm-grpc fake-judge: cannot listen on {config.host}:{config.port}: {reason}{hint}",
            file=sys.stderr,
        )
        return 2
    try:
        print(f"fake-judge listening on {server.url}", flush=True)
        stop_requested.wait()
    finally:
        server.stop()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
