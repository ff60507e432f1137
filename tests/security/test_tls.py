"""TLS and mutual TLS over real sockets, with certificates generated for this test run."""

from __future__ import annotations

import asyncio
import sys

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genrm_grpc.config import ConfigError, load_settings

from .certs import Pem
from .conftest import CANDIDATES, PROMPT, Pki, StartServer, rpc_code, stub, tls_channel


async def _compare(channel: grpc.aio.Channel) -> pb.CompareResponse:
    async with channel:
        reply: pb.CompareResponse = await stub(channel).Compare(
            pb.CompareRequest(prompt=PROMPT, candidates=CANDIDATES), timeout=30
        )
    return reply


async def _refused(channel: grpc.aio.Channel) -> grpc.StatusCode:
    async with channel:
        with pytest.raises(grpc.RpcError) as caught:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
    return rpc_code(caught.value)


async def test_tls_client_trusting_the_ca_is_served(start_server: StartServer, pki: Pki) -> None:
    server = await start_server(tls={"cert_file": pki.server.cert, "key_file": pki.server.key})
    reply = await _compare(tls_channel(server.port, pki.ca))
    assert len(reply.rewards) == 2


async def test_tls_server_refuses_plaintext_and_untrusted_clients(
    start_server: StartServer, pki: Pki
) -> None:
    server = await start_server(tls={"cert_file": pki.server.cert, "key_file": pki.server.key})
    plaintext = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    assert await _refused(plaintext) == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust the test CA (system roots only) rejects the server.
    assert await _refused(tls_channel(server.port, None)) == grpc.StatusCode.UNAVAILABLE


async def test_mtls_requires_a_client_certificate_from_the_client_ca(
    start_server: StartServer, pki: Pki
) -> None:
    server = await start_server(
        tls={
            "cert_file": pki.server.cert,
            "key_file": pki.server.key,
            "client_ca_file": pki.ca.cert,
            "require_client_auth": True,
        }
    )
    assert await _refused(tls_channel(server.port, pki.ca)) == grpc.StatusCode.UNAVAILABLE
    rogue = tls_channel(server.port, pki.ca, pki.rogue_client)
    assert await _refused(rogue) == grpc.StatusCode.UNAVAILABLE
    reply = await _compare(tls_channel(server.port, pki.ca, pki.client))
    assert len(reply.rewards) == 2


async def _health_cli(*args: str | object) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "genrm_grpc.cli",
        "health",
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_health_command_speaks_mtls_and_verifies_the_server_name(
    start_server: StartServer, pki: Pki
) -> None:
    server = await start_server(
        tls={
            "cert_file": pki.server.cert,
            "key_file": pki.server.key,
            "client_ca_file": pki.ca.cert,
            "require_client_auth": True,
        }
    )
    target = f"127.0.0.1:{server.port}"
    client: Pem = pki.client
    code, out = await _health_cli(
        "--server", target, "--ca-file", pki.ca.cert, "--cert-file", client.cert,
        "--key-file", client.key, "--server-name", "localhost",
    )  # fmt: skip
    assert (code, out.strip()) == (0, f"{target} genrm.cohort.v1.CohortService: SERVING")
    code, out = await _health_cli("--server", target, "--ca-file", pki.ca.cert, "--timeout-s", 5)
    assert code == 1 and "UNAVAILABLE" in out
    code, out = await _health_cli("--server", target, "--timeout-s", 5)  # plaintext
    assert code == 1 and "UNAVAILABLE" in out


def test_tls_settings_are_checked_at_start_up(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"tls\.cert_file"):
        load_settings(tls={"cert_file": "/nonexistent.crt", "key_file": pki.server.key})
    with pytest.raises(ConfigError, match=r"require_client_auth needs tls\.client_ca_file"):
        load_settings(
            tls={
                "cert_file": pki.server.cert,
                "key_file": pki.server.key,
                "require_client_auth": True,
            }
        )
