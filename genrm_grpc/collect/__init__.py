"""``genrm-grpc collect``: score a NeMo Gym rollout file end to end (see docs/collector.md).

::

    genrm-grpc collect --server HOST:PORT --input rollouts.jsonl --output results.jsonl

writes ``results.jsonl`` (rows with usable rewards), ``results.failures.jsonl`` (masked
judge failures, failed groups, bad rows — never in the main file),
``results.metrics.json`` and ``results.groups.jsonl`` (the journal of group ids and
attempts that ``--resume`` reuses).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from genrm_cohort_client import ChannelOptions, RetryPolicy

from genrm_grpc.collect.runner import FAILURE_CLASSES, CollectConfig, UsageError, run

__all__ = ["CollectConfig", "build_parser", "main", "main_async", "run"]


def _add_connection_options(p: argparse.ArgumentParser) -> None:
    """How the run reaches the server: connect deadline, retries, message size, TLS, token."""
    connect = p.add_mutually_exclusive_group()
    connect.add_argument(
        "--connect-timeout-s",
        type=float,
        default=5.0,
        help="give up when no server answers at --server within this many seconds (default 5)",
    )
    connect.add_argument(
        "--wait-for-server",
        action="store_true",
        help="wait for a server that is still starting (up to --timeout-s) instead",
    )
    p.add_argument(
        "--retries", type=int, default=8, help="calls per group on UNAVAILABLE (default 8)"
    )
    p.add_argument(
        "--max-group-attempts",
        type=int,
        default=1,
        help="on ABORTED, resubmit the same answers as attempt + 1 up to this many attempts",
    )
    p.add_argument(
        "--max-message-mib",
        type=float,
        default=16.0,
        help="largest gRPC message sent or received, in MiB (default 16; the server's "
        "max_message_bytes must allow it too)",
    )
    p.add_argument("--tls", action="store_true", help="use TLS (system roots unless given)")
    p.add_argument("--root-certs", type=Path, help="PEM root certificates (implies --tls)")
    p.add_argument("--client-cert", type=Path, help="PEM client certificate chain (mTLS)")
    p.add_argument("--client-key", type=Path, help="PEM client private key (mTLS)")
    p.add_argument("--server-name", help="TLS server name override")
    p.add_argument(
        "--token-env", help="name of an env var holding a bearer token (authorization header)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="genrm-grpc collect",
        description="Score a NeMo Gym rollout file with a genrm-grpc server.",
    )
    p.add_argument("--server", required=True, help="gRPC target, e.g. 127.0.0.1:50051")
    p.add_argument("--input", required=True, type=Path, help="rollout rows (JSONL)")
    p.add_argument("--output", required=True, type=Path, help="results file (JSONL)")
    p.add_argument("--concurrency", type=int, default=8, help="groups in flight (default 8)")
    p.add_argument("--resume", action="store_true", help="continue an earlier run's output")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("--strict", action="store_true", help="any bad row fails the run (exit 2)")
    p.add_argument(
        "--count-failure-classes-as-zero",
        action="append",
        default=[],
        metavar="CLASS[,CLASS]",
        help=f"count rows of these failure classes as reward 0 in the metrics only "
        f"({', '.join(c for c in FAILURE_CLASSES if c != 'bad_row')})",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="members per group (default: _ng_group_size, else max _ng_rollout_index + 1)",
    )
    p.add_argument("--timeout-s", type=float, default=3600.0, help="deadline of one group call")
    _add_connection_options(p)
    progress = p.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show groups done / failed / in flight on stderr (the default, unless --quiet)",
    )
    progress.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress line"
    )
    p.add_argument("--quiet", action="store_true", help="no messages on stderr")
    return p


def _config(args: argparse.Namespace) -> CollectConfig:
    zero: set[str] = set()
    for item in args.count_failure_classes_as_zero:
        zero.update(c.strip() for c in item.split(",") if c.strip())
    unknown = sorted(zero - set(FAILURE_CLASSES) | ({"bad_row"} & zero))
    if unknown:
        raise UsageError(f"unknown failure class(es) for zero counting: {', '.join(unknown)}")
    if args.concurrency < 1 or args.retries < 1 or args.max_group_attempts < 1:
        raise UsageError("--concurrency, --retries and --max-group-attempts must be >= 1")
    if args.group_size is not None and args.group_size < 1:
        raise UsageError("--group-size must be >= 1")
    if not 0 < args.timeout_s < float("inf"):
        raise UsageError("--timeout-s must be > 0")
    if not 0 < args.connect_timeout_s < float("inf"):
        raise UsageError("--connect-timeout-s must be > 0")
    connect_timeout_s = args.timeout_s if args.wait_for_server else args.connect_timeout_s
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise UsageError(f"--token-env {args.token_env}: the variable is unset or empty")

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    try:
        size = int(args.max_message_mib * 1024 * 1024)
        channel = ChannelOptions(
            max_send_message_bytes=size,
            max_receive_message_bytes=size,
            tls=args.tls,
            root_certificates=read(args.root_certs),
            client_cert_chain=read(args.client_cert),
            client_private_key=read(args.client_key),
            server_name_override=args.server_name,
            bearer_token=token,
            connect_timeout_s=connect_timeout_s,
        )
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return CollectConfig(
        server=args.server,
        input=args.input,
        output=args.output,
        concurrency=args.concurrency,
        resume=args.resume,
        overwrite=args.overwrite,
        strict=args.strict,
        zero_classes=frozenset(zero),
        group_size=args.group_size,
        timeout_s=args.timeout_s,
        retry=RetryPolicy(max_attempts=args.retries),
        max_group_attempts=args.max_group_attempts,
        channel=channel,
        progress=args.progress,
        quiet=args.quiet,
    )


async def main_async(argv: list[str]) -> int:
    """``main`` for callers that already run an event loop (tests)."""
    args = build_parser().parse_args(argv)
    try:
        return await run(_config(args))
    except UsageError as exc:
        print(f"genrm-grpc collect: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
