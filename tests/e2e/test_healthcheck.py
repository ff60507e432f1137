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
    assert done.stdout == f"127.0.0.1:{port} (overall): SERVING\n"


def test_healthcheck_follows_genrm_listen_too(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text('listen: "127.0.0.1:1"\n')
    env = _env(GENRM_LISTEN=f"127.0.0.1:{_free_port()}")
    with _server(config, env) as address:
        done = _check(config, env)
    assert done.returncode == 0 and done.stdout.startswith(f"{address} (overall): SERVING")


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
