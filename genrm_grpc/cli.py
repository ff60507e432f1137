"""``genrm-grpc serve | fake-judge | demo | health | collect | config``."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

from genrm_grpc.config import ConfigError, load_settings

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


def _serve(argv: list[str]) -> int:
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
            help=f"overrides `{dest}` (env GENRM_{dest.upper()})",
        )
    for flag, dest, kind in _JUDGE_FLAGS:
        parser.add_argument(
            flag,
            dest=f"opt_{dest}",
            type=kind,
            default=None,
            metavar=kind.__name__.upper(),
            help=f"overrides `judge.{dest}` (env GENRM_JUDGE__{dest.upper()})",
        )
    args = parser.parse_args(argv)
    top = {dest: getattr(args, f"opt_{dest}") for _, dest, _ in _FLAGS}
    judge = {dest: getattr(args, f"opt_{dest}") for _, dest, _ in _JUDGE_FLAGS}
    judge = {k: v for k, v in judge.items() if v is not None}
    try:
        if judge:
            # Flags override single judge keys; the rest of the block comes from file/env.
            base = load_settings(args.config, **top)
            top["judge"] = base.judge.model_copy(update=judge).model_dump()
        settings = load_settings(args.config, **top)
        settings.judge.api_key()
    except ConfigError as exc:
        print(f"genrm-grpc: {exc}", file=sys.stderr)
        return 2

    from genrm_grpc import logs
    from genrm_grpc.server.app import run

    logs.configure(settings.log_level, settings.log_format)

    def ready(port: int) -> None:
        host = settings.listen.rpartition(":")[0]
        print(f"genrm-grpc serving on {host}:{port}", flush=True)

    asyncio.run(run(settings, on_ready=ready))
    return 0


def _health(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc health",
        description="Check grpc.health.v1: exit 0 only when the service is SERVING.",
    )
    parser.add_argument("--server", "--target", dest="server", default="127.0.0.1:50051")
    parser.add_argument("--service", default="", help="service name ('' = the whole server)")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--tls", action="store_true", help="connect with TLS")
    parser.add_argument("--ca-file", help="PEM CA bundle to verify the server (implies --tls)")
    parser.add_argument("--cert-file", help="client certificate for mTLS (implies --tls)")
    parser.add_argument("--key-file", help="client private key for mTLS")
    parser.add_argument(
        "--server-name", help="TLS name to verify instead of the host (e.g. probes on 127.0.0.1)"
    )
    parser.add_argument("--token-file", help="file holding a bearer token (the first one is used)")
    parser.add_argument("--token-env", help="environment variable holding a bearer token")
    args = parser.parse_args(argv)

    import os

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if (args.cert_file is None) != (args.key_file is None):
        print("genrm-grpc health: --cert-file and --key-file go together", file=sys.stderr)
        return 2
    metadata: list[tuple[str, str]] = []
    try:
        token = None
        if args.token_file:
            lines = pathlib.Path(args.token_file).read_text().split()
            token = lines[0] if lines else None
        elif args.token_env:
            token = os.environ.get(args.token_env, "").split(",")[0].strip() or None
        if (args.token_file or args.token_env) and token is None:
            print("genrm-grpc health: no token in --token-file/--token-env", file=sys.stderr)
            return 2
        if token is not None:
            metadata.append(("authorization", f"Bearer {token}"))
        secure = args.tls or args.ca_file or args.cert_file
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        if secure:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(args.ca_file),
                private_key=_read(args.key_file),
                certificate_chain=_read(args.cert_file),
            )
            channel = grpc.secure_channel(args.server, creds, options=options)
        else:
            channel = grpc.insecure_channel(args.server, options=options)
    except OSError as exc:
        print(f"genrm-grpc health: {exc}", file=sys.stderr)
        return 2

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
    return 0 if status == "SERVING" else 1


def _read(path: str | None) -> bytes | None:
    return None if path is None else pathlib.Path(path).read_bytes()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = ("serve", "fake-judge", "demo", "health", "collect", "config")
    if not args or args[0] not in commands:
        print(f"usage: genrm-grpc {{{'|'.join(commands)}}} [options]  (--help per command)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return _serve(rest)
    if command == "health":
        return _health(rest)
    if command == "collect":
        from genrm_grpc.collect import main as collect_main

        return collect_main(rest)
    if command == "config":
        from genrm_grpc.gym_config import main as config_main

        return config_main(rest)
    if command == "fake-judge":
        from genrm_grpc.judge.fake import main as fake_main

        return fake_main(rest)
    from genrm_grpc.demo import main as demo_main

    return demo_main(rest)


if __name__ == "__main__":
    sys.exit(main())
