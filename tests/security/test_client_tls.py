"""The collector client's TLS, mTLS and bearer-token options against a real secured server."""

from __future__ import annotations

import pytest
from genrm_cohort_client import ChannelOptions, CohortClient, CohortError, RetryPolicy

from genrm_grpc.server.app import CohortServer

from .conftest import Pki, StartServer

TOKEN = "client-tls-token-1"


@pytest.fixture
def secured(start_server: StartServer, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> StartServer:
    monkeypatch.setenv("CLIENT_TLS_TOKENS", TOKEN)

    async def start() -> CohortServer:
        return await start_server(
            tls={
                "cert_file": pki.server.cert,
                "key_file": pki.server.key,
                "client_ca_file": pki.ca.cert,
                "require_client_auth": True,
            },
            auth={"tokens_env": "CLIENT_TLS_TOKENS"},
        )

    return start


def _options(pki: Pki, *, client_cert: bool = True, token: str | None = TOKEN) -> ChannelOptions:
    return ChannelOptions(
        tls=True,
        root_certificates=pki.ca.cert_bytes(),
        client_cert_chain=pki.client.cert_bytes() if client_cert else None,
        client_private_key=pki.client.key_bytes() if client_cert else None,
        bearer_token=token,
        wait_for_ready=False,
    )


async def test_client_with_ca_client_certificate_and_token_is_served(
    secured: StartServer, pki: Pki
) -> None:
    server = await secured()
    async with CohortClient(f"localhost:{server.port}", options=_options(pki)) as client:
        reply = await client.compare("Name a prime number.", ["Seven.", "Four."], timeout=30)
    assert len(reply.rewards) == 2


@pytest.mark.parametrize(
    ("client_cert", "token", "code"),
    [
        (False, TOKEN, "UNAVAILABLE"),
        (True, None, "UNAUTHENTICATED"),
        (True, "wrong", "UNAUTHENTICATED"),
    ],
)
async def test_client_without_certificate_or_valid_token_is_refused_without_retries(
    secured: StartServer, pki: Pki, client_cert: bool, token: str | None, code: str
) -> None:
    server = await secured()
    options = _options(pki, client_cert=client_cert, token=token)
    no_retry = RetryPolicy(max_attempts=1)
    async with CohortClient(f"localhost:{server.port}", options=options, retry=no_retry) as client:
        with pytest.raises(CohortError) as caught:
            await client.compare("Name a prime number.", ["Seven.", "Four."], timeout=10)
    assert caught.value.code.name == code
