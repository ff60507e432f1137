"""Fixtures: a throw-away PKI in tmp_path, and servers started with security settings."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2, status_pb2

from genrm_grpc.config import load_settings
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

from .certs import CertificateAuthority, Pem

PROMPT = pb.Prompt(messages=[pb.ChatMessage(role="user", content="Name a prime number.")])
CANDIDATES = [pb.Candidate(output_text="Seven."), pb.Candidate(output_text="Four.")]


@dataclass(frozen=True)
class Pki:
    ca: Pem
    server: Pem
    client: Pem
    #: A client certificate from a CA the server does not trust.
    rogue_client: Pem


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> Pki:
    ca = CertificateAuthority(tmp_path, "test-ca")
    rogue = CertificateAuthority(tmp_path, "rogue-ca")
    return Pki(
        ca=ca.pem,
        server=ca.issue("server", server=True),
        client=ca.issue("client", server=False),
        rogue_client=rogue.issue("rogue-client", server=False),
    )


@pytest.fixture
def fake_judge() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(FakeJudgeConfig()) as judge:
        yield judge


@pytest.fixture(autouse=True)
def _on_each_store(store_of_kind: str) -> str:
    """Every test here runs on each kind of store (tests/store_kinds.py)."""
    return store_of_kind


StartServer = Callable[..., Awaitable[CohortServer]]


@pytest.fixture
async def start_server(fake_judge: FakeJudgeServer) -> AsyncIterator[StartServer]:
    """Start a CohortServer on 127.0.0.1:0 with settings overrides; stopped at teardown."""
    running: list[CohortServer] = []

    async def start(**overrides: Any) -> CohortServer:
        settings = load_settings(
            listen="127.0.0.1:0",
            judge={"url": fake_judge.url},
            genrm_parse_retry_sleep_s=0.01,
            shutdown_grace_s=overrides.pop("shutdown_grace_s", 0.5),
            **overrides,
        )
        server = CohortServer(settings)
        await server.start()
        running.append(server)
        return server

    yield start
    for server in running:
        if not server.runtime.draining:
            await server.stop()


def tls_channel(port: int, ca: Pem | None, client: Pem | None = None) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_bytes() if ca is not None else None,
        private_key=client.key_bytes() if client is not None else None,
        certificate_chain=client.cert_bytes() if client is not None else None,
    )
    return grpc.aio.secure_channel(f"localhost:{port}", creds)


def stub(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.CohortServiceStub(channel)


def rpc_code(exc: grpc.RpcError) -> grpc.StatusCode:
    code: grpc.StatusCode = exc.code()
    return code


@dataclass(frozen=True)
class Details:
    code: grpc.StatusCode
    message: str
    info: error_details_pb2.ErrorInfo | None
    violations: dict[str, str]


def details(exc: grpc.RpcError) -> Details:
    """Status code, ErrorInfo and BadRequest field violations of a failed call."""
    status = None
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
    info = None
    violations: dict[str, str] = {}
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            assert info is None, "exactly one ErrorInfo"
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations.update({v.field: v.description for v in bad.field_violations})
    return Details(rpc_code(exc), exc.details() or "", info, violations)
