"""The ``genrm-grpc`` command: a table of subcommands (serve, collect, health, …)."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import logging
import pathlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genrm_grpc.config import ConfigError, load_settings

if TYPE_CHECKING:
    import grpc

#: The gRPC service whose health ``genrm-grpc health`` reports by default (the server's
#: ``SERVICE_NAME``; spelled out so that the command does not load the protobuf modules).
COHORT_SERVICE = "genrm.cohort.v1.CohortService"

# Flags for the settings operators change most; everything else via YAML or GENRM_*.
_FLAGS: tuple[tuple[str, str, type], ...] = (
    ("--listen", "listen", str),
    ("--num-rollouts-per-prompt", "num_rollouts_per_prompt", int),
    ("--comparison-mode", "comparison_mode", str),
    ("--comparison-strategy", "comparison_strategy", str),
    ("--num-judges-per-comparison", "num_judges_per_comparison", int),
    ("--judge-max-concurrency", "judge_max_concurrency", int),
    ("--judge-schedule", "judge_schedule", str),
    ("--cohort-collection-timeout-s", "cohort_collection_timeout_s", float),
    ("--cohort-evaluation-timeout-s", "cohort_evaluation_timeout_s", float),
    ("--judge-request-timeout-s", "judge_request_timeout_s", float),
    ("--genrm-parse-retries", "genrm_parse_retries", int),
    ("--genrm-parse-retry-sleep-s", "genrm_parse_retry_sleep_s", float),
    ("--max-active-cohorts", "max_active_cohorts", int),
    ("--shutdown-grace-s", "shutdown_grace_s", float),
    ("--store", "store", str),
    ("--metrics-listen", "metrics_listen", str),
    ("--max-concurrent-streams", "max_concurrent_streams", int),
    ("--log-level", "log_level", str),
    ("--log-format", "log_format", str),
)
_JUDGE_FLAGS: tuple[tuple[str, str, type], ...] = (
    ("--judge-url", "url", str),
    ("--judge-api", "api", str),
    ("--judge-model", "model", str),
    ("--judge-max-output-tokens", "max_output_tokens", int),
)


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc serve",
        description="Run the gRPC server. Settings: flags > GENRM_* env > --config YAML > "
        "defaults; every key is documented in the README's configuration reference.",
    )
    parser.add_argument("--config", help="YAML configuration file")
    for flag, dest, kind in _FLAGS:
        parser.add_argument(
            flag,
            dest=f"opt_{dest}",
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"overrides {dest} (env GENRM_{dest.upper()})",
        )
    for flag, dest, kind in _JUDGE_FLAGS:
        parser.add_argument(
            flag,
            dest=f"opt_{dest}",
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"overrides judge.{dest} (env GENRM_JUDGE__{dest.upper()})",
        )
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as ``load_settings`` overrides (None: not given)."""
    top: dict[str, Any] = {dest: getattr(args, f"opt_{dest}") for _, dest, _ in _FLAGS}
    judge = {dest: getattr(args, f"opt_{dest}") for _, dest, _ in _JUDGE_FLAGS}
    judge = {k: v for k, v in judge.items() if v is not None}
    if judge:
        # Sources merge per key: the rest of the judge block comes from env and YAML.
        top["judge"] = judge
    return top


def _serve(argv: list[str]) -> int:
    args = _serve_parser().parse_args(argv)
    top = _overrides(args)
    try:
        settings = load_settings(args.config, **top)
        settings.judge.api_key()
    except ConfigError as exc:
        print(f"genrm-grpc: {exc}", file=sys.stderr)
        return 2

    from genrm_grpc import logs
    from genrm_grpc.server.app import run

    logs.configure(settings.log_level, settings.log_format)
    from genrm_grpc.server import fds

    nofile = fds.raise_soft_limit()
    refused = fds.refusal(nofile, settings.judge.max_connections)
    if refused is not None:
        print(f"genrm-grpc: {refused}", file=sys.stderr)
        return 2
    if nofile.raised:
        logging.getLogger("genrm_grpc").info(
            "raised the open-files limit",
            extra={"rlimit_nofile_before": nofile.before, "rlimit_nofile": nofile.soft},
        )

    def ready(port: int) -> None:
        host = settings.listen.rpartition(":")[0]
        print(f"genrm-grpc serving on {host}:{port}", flush=True)

    from genrm_grpc.store.records import StoreError

    try:
        asyncio.run(run(settings, on_ready=ready))
    except (OSError, ConfigError, StoreError) as exc:  # a busy port, an unreadable store, …
        print(f"genrm-grpc: {exc}", file=sys.stderr)
        return 2
    return 0


def _health_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc health",
        description="Check grpc.health.v1: exit 0 only when the service is SERVING. By "
        f"default the cohort service ({COHORT_SERVICE}), which is NOT_SERVING while the "
        "server drains or its judge (or shared store) is unreachable: a readiness check. "
        "--service '' checks the server as a whole, SERVING until it drains: a liveness "
        "check. The line printed names the service it reports.",
    )
    parser.add_argument(
        "--server",
        "--target",
        dest="server",
        help="HOST:PORT to check (default: from --config, else 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--config",
        help="the server's YAML config: check the port its listen key (or GENRM_LISTEN) "
        "names, on loopback when it listens on all addresses",
    )
    parser.add_argument(
        "--service",
        default=COHORT_SERVICE,
        help=f"service to check (default: {COHORT_SERVICE}; '' = the whole server)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=5.0, help="deadline of the health check (default 5)"
    )
    parser.add_argument("--tls", action="store_true", help="connect with TLS")
    parser.add_argument("--ca-file", help="PEM CA bundle to verify the server (implies --tls)")
    parser.add_argument("--cert-file", help="client certificate for mTLS (implies --tls)")
    parser.add_argument("--key-file", help="client private key for mTLS")
    parser.add_argument(
        "--server-name", help="TLS name to verify instead of the host (e.g. probes on 127.0.0.1)"
    )
    parser.add_argument("--token-file", help="file holding a bearer token (the first one is used)")
    parser.add_argument("--token-env", help="environment variable holding a bearer token")
    return parser


def _health(argv: list[str]) -> int:
    args = _health_parser().parse_args(argv)
    if (args.cert_file is None) != (args.key_file is None):
        print("genrm-grpc health: --cert-file and --key-file go together", file=sys.stderr)
        return 2
    if args.server is None:
        try:
            args.server = _health_target(args)
        except ConfigError as exc:
            print(f"genrm-grpc health: {exc}", file=sys.stderr)
            return 2
    metadata: list[tuple[str, str]] = []
    try:
        token = _health_token(args)
        if (args.token_file or args.token_env) and token is None:
            print("genrm-grpc health: no token in --token-file/--token-env", file=sys.stderr)
            return 2
        if token is not None:
            metadata.append(("authorization", f"Bearer {token}"))
        channel = _health_channel(args)
    except OSError as exc:
        print(f"genrm-grpc health: {exc}", file=sys.stderr)
        return 2
    return _health_check(args, channel, metadata)


def _health_token(args: argparse.Namespace) -> str | None:
    """The bearer token of ``--token-file`` (its first word) or ``--token-env``."""
    import os

    if args.token_file:
        lines = pathlib.Path(args.token_file).read_text().split()
        return lines[0] if lines else None
    if args.token_env:
        return os.environ.get(args.token_env, "").split(",")[0].strip() or None
    return None


def _health_channel(args: argparse.Namespace) -> grpc.Channel:
    import grpc

    secure = args.tls or args.ca_file or args.cert_file
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    if secure:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(args.ca_file),
            private_key=_read(args.key_file),
            certificate_chain=_read(args.cert_file),
        )
        return grpc.secure_channel(args.server, creds, options=options)
    return grpc.insecure_channel(args.server, options=options)


def _health_check(
    args: argparse.Namespace, channel: grpc.Channel, metadata: list[tuple[str, str]]
) -> int:
    """One ``Check`` call; the line that reports it and the exit code (0: SERVING)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service),
                timeout=args.timeout_s,
                metadata=metadata,
            )
        except grpc.RpcError as exc:
            print(f"{args.server}: {exc.code().name}: {exc.details()}")
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.server} {args.service or '(overall)'}: {status}")
    if status == "NOT_SERVING" and args.service == COHORT_SERVICE:
        print(
            "the cohort service is not ready: the server is draining, or its judge (or its "
            "shared store) has been unreachable too long; see the server's log, and "
            "--service '' for whether the process itself is up"
        )
    return 0 if status == "SERVING" else 1


def _health_target(args: argparse.Namespace) -> str:
    """The address to probe: the configured ``listen`` (wildcards → loopback)."""
    if args.config is None:
        return "127.0.0.1:50051"
    settings = load_settings(args.config)
    host, _, port = settings.listen.rpartition(":")
    if port == "0":
        raise ConfigError(f"listen {settings.listen} has no fixed port: pass --server")
    if settings.tls is not None and not (args.tls or args.ca_file or args.cert_file):
        raise ConfigError(
            "the server serves TLS (tls.cert_file): pass --ca-file, and --server-name when "
            "its certificate does not name the probed host"
        )
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"  # listening on every address includes loopback
    return f"{host}:{port}"


def _read(path: str | None) -> bytes | None:
    return None if path is None else pathlib.Path(path).read_bytes()


def _collect(argv: list[str]) -> int:
    from genrm_grpc.collect import main as collect_main

    return collect_main(argv)


def _config(argv: list[str]) -> int:
    from genrm_grpc.gym_config import main as config_main

    return config_main(argv)


def _fake_judge(argv: list[str]) -> int:
    from genrm_grpc.testing.cli import main as fake_main

    return fake_main(argv)


def _judges(argv: list[str]) -> int:
    from genrm_grpc.judges_view import main as judges_main

    return judges_main(argv)


def _demo(argv: list[str]) -> int:
    from genrm_grpc.demo import main as demo_main

    return demo_main(argv)


@dataclass(frozen=True)
class Command:
    """One subcommand: a one-line summary for the overview and its ``main(argv)``."""

    summary: str
    run: Callable[[list[str]], int]


# The subcommands in the order the overview lists them; add new ones here.
COMMANDS: dict[str, Command] = {
    "serve": Command("run the gRPC server (settings: flags > GENRM_* env > YAML)", _serve),
    "collect": Command("score a NeMo Gym rollout file (JSONL) with a running server", _collect),
    "health": Command("check a server's health; exit 0 only when it is SERVING", _health),
    "judges": Command("show the judge farm (endpoints, state, load) as a server sees it", _judges),
    "fake-judge": Command(
        "run the fake judge: an OpenAI-API test double, not a model", _fake_judge
    ),
    "demo": Command("start a fake judge and a server on loopback and show rewards", _demo),
    "config": Command(
        "config from-gym GYM_YAML: print a NeMo Gym config as genrm-grpc YAML", _config
    ),
}


def version() -> str:
    """``genrm-grpc X.Y.Z (genrm-cohort-client A.B.C)`` from the installed distributions."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    parts = []
    for dist in ("genrm-grpc", "genrm-cohort-client"):
        try:
            parts.append(f"{dist} {dist_version(dist)}")
        except PackageNotFoundError:  # running from a source tree that is not installed
            parts.append(f"{dist} (not installed)")
    return f"{parts[0]} ({parts[1]})"


def overview() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: genrm-grpc COMMAND [options]",
        "",
        "Group-relative rewards from a generative reward model judge, over gRPC.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()),
        "",
        "genrm-grpc COMMAND --help shows a command's options; genrm-grpc --version the version.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(overview())
        return 0
    if args and args[0] in ("-V", "--version"):
        print(version())
        return 0
    if not args:
        print(overview(), file=sys.stderr)
        return 2
    command = COMMANDS.get(args[0])
    if command is None:
        close = difflib.get_close_matches(args[0], list(COMMANDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"genrm-grpc: unknown command {args[0]!r}{hint}\n", file=sys.stderr)
        print(overview(), file=sys.stderr)
        return 2
    return command.run(args[1:])


if __name__ == "__main__":
    sys.exit(main())
