"""The image's HEALTHCHECK command follows the port the server's config names."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "genrm_grpc.cli"]

pytestmark = pytest.mark.e2e


def _healthcheck_command(config: pathlib.Path) -> list[str]:
    """The Dockerfile's HEALTHCHECK, with the image's config path replaced by ``config``."""
    text = (ROOT / "Dockerfile").read_text()
    command: list[str] = json.loads(
        text.split("HEALTHCHECK", 1)[1].split("CMD ", 1)[1].split("\n")[0]
    )
    assert command[:2] == ["genrm-grpc", "health"]
    return [*CLI, *(str(config) if a == "/etc/genrm/server.yaml" else a for a in command[1:])]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GENRM_")}
    return {**env, **extra}


@contextmanager
def _server(config: pathlib.Path, env: dict[str, str]) -> Iterator[str]:
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config), "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        # No GENRM_STORE: the default store file lands next to the config, not in the
        # checkout.
        cwd=config.parent,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("genrm-grpc serving on"), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _check(config: pathlib.Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _healthcheck_command(config), capture_output=True, text=True, timeout=60, env=env
    )


def test_healthcheck_probes_the_port_of_the_config_on_loopback(tmp_path: pathlib.Path) -> None:
    port = _free_port()
    config = tmp_path / "server.yaml"
    config.write_text(f'listen: "0.0.0.0:{port}"\n')
    with _server(config, _env()) as address:
        assert address == f"0.0.0.0:{port}"
        done = _check(config, _env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == f"127.0.0.1:{port} genrm.cohort.v1.CohortService: SERVING\n"


def test_healthcheck_follows_genrm_listen_too(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text('listen: "127.0.0.1:1"\n')
    env = _env(GENRM_LISTEN=f"127.0.0.1:{_free_port()}")
    with _server(config, env) as address:
        done = _check(config, env)
    assert done.returncode == 0
    assert done.stdout.startswith(f"{address} genrm.cohort.v1.CohortService: SERVING")


def test_healthcheck_without_a_server_on_that_port_is_unhealthy(tmp_path: pathlib.Path) -> None:
    with socket.socket() as closed:  # bound, not listening: refused
        closed.bind(("127.0.0.1", 0))
        config = tmp_path / "server.yaml"
        config.write_text(f'listen: "127.0.0.1:{closed.getsockname()[1]}"\n')
        done = _check(config, _env())
    assert done.returncode == 1 and "UNAVAILABLE" in done.stdout


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ('listen: "127.0.0.1:0"\n', "listen 127.0.0.1:0 has no fixed port: pass --server"),
        ("lisen: x\n", "invalid configuration: lisen: Extra inputs are not permitted"),
    ],
)
def test_healthcheck_with_an_unusable_config_says_why_in_one_line(
    tmp_path: pathlib.Path, yaml_text: str, message: str
) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(yaml_text)
    done = _check(config, _env())
    assert done.returncode == 2
    assert done.stderr.startswith(f"genrm-grpc health: {message}")
    assert len(done.stderr.strip().splitlines()) == 1


def test_healthcheck_of_a_tls_server_asks_for_the_ca_instead_of_probing_in_plaintext(
    tmp_path: pathlib.Path,
) -> None:
    pem = tmp_path / "server.pem"  # only its existence is checked before the probe
    pem.write_text("")
    config = tmp_path / "server.yaml"
    config.write_text(f'listen: "0.0.0.0:50051"\ntls: {{cert_file: {pem}, key_file: {pem}}}\n')
    done = _check(config, _env())
    assert done.returncode == 2
    assert done.stderr == (
        "genrm-grpc health: the server serves TLS (tls.cert_file): pass --ca-file, and "
        "--server-name when its certificate does not name the probed host\n"
    )


def _health(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "health", *args], capture_output=True, text=True, timeout=60, env=_env()
    )


def _cohort_service_status(target: str) -> Iterator[int]:
    """The cohort service's health statuses as the server announces them (Watch)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest(service="genrm.cohort.v1.CohortService")
        for reply in health_pb2_grpc.HealthStub(channel).Watch(request, timeout=60):
            yield reply.status


def test_health_reports_the_cohort_service_by_default_so_a_failing_judge_is_not_serving(
    tmp_path: pathlib.Path,
) -> None:
    from grpc_health.v1 import health_pb2

    dead_judge = _free_port()  # nothing listens there: every judge call and probe fails
    config = tmp_path / "server.yaml"
    config.write_text(
        f'listen: "127.0.0.1:{_free_port()}"\n'
        f"judge: {{url: http://127.0.0.1:{dead_judge}}}\n"
        "judge_unreachable_window_s: 0.5\n"
    )
    with _server(config, _env()) as target:
        # Wait for the server to take the cohort service out of rotation (no sleep).
        statuses = _cohort_service_status(target)
        assert next(
            status for status in statuses if status != health_pb2.HealthCheckResponse.SERVING
        ) == (health_pb2.HealthCheckResponse.NOT_SERVING)
        statuses.close()
        readiness = _health("--server", target)
        liveness = _health("--server", target, "--service", "")
    assert readiness.returncode == 1, readiness.stdout + readiness.stderr
    first, hint = readiness.stdout.splitlines()
    assert first == f"{target} genrm.cohort.v1.CohortService: NOT_SERVING"
    assert "judge" in hint and "--service ''" in hint
    assert liveness.returncode == 0, liveness.stdout + liveness.stderr
    assert liveness.stdout == f"{target} (overall): SERVING\n"
