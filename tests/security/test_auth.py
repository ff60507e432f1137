"""Bearer-token authentication through the aio server interceptor, over real sockets."""

from __future__ import annotations

import logging
import pathlib

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from genrm_grpc.config import ConfigError, load_settings
from genrm_grpc.runtime.live import Census
from genrm_grpc.server.errors import DOMAIN
from genrm_grpc.server.security import TokenAuthInterceptor

from .conftest import CANDIDATES, PROMPT, Pki, StartServer, details, rpc_code, stub, tls_channel

TOKENS = ("s3cret-token-one", "s3cret-token-two")


@pytest.fixture
def tokens_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TEST_GENRM_TOKENS", ",".join(TOKENS))
    return "TEST_GENRM_TOKENS"


def _bearer(token: str, scheme: str = "Bearer") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"{scheme} {token}"),)


COMPARE = pb.CompareRequest(prompt=PROMPT, candidates=CANDIDATES)


async def test_calls_without_a_valid_token_are_unauthenticated_with_error_info(
    start_server: StartServer, tokens_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_server(auth={"tokens_env": tokens_env})
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = stub(channel)
        for metadata, why in [
            ((), "missing"),
            (_bearer("wrong-guess"), "invalid"),
            (_bearer(TOKENS[0] + "x"), "invalid"),
            (_bearer(TOKENS[0][:-1]), "invalid"),
            ((("authorization", TOKENS[0]),), "missing"),  # no scheme
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                await cohorts.Compare(COMPARE, metadata=metadata, timeout=10)
            got = details(caught.value)
            assert got.code == grpc.StatusCode.UNAUTHENTICATED
            assert got.info is not None
            assert (got.info.reason, got.info.domain) == ("UNAUTHENTICATED", DOMAIN)
            assert dict(got.info.metadata) == {"auth": why}
        # Streaming methods are guarded too (the interceptor wraps every handler kind).
        request = pb.StreamGroupsRequest(
            member=pb.SubmitMemberRequest(
                member=pb.MemberRef(group_id="g", rollout_index=0, group_size=2),
                prompt=PROMPT,
                candidate=CANDIDATES[0],
            )
        )
        call = cohorts.StreamGroups(iter([request]), metadata=_bearer("nope"), timeout=10)
        with pytest.raises(grpc.RpcError) as caught:
            async for _ in call:
                pass
        assert details(caught.value).info is not None
        assert rpc_code(caught.value) == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            await cohorts.GetCohort(pb.GetCohortRequest(), timeout=10)
        assert rpc_code(caught.value) == grpc.StatusCode.UNAUTHENTICATED
    assert await server.runtime.refresh_census() == Census()  # nothing reached the servicer
    logged = caplog.text
    assert "unauthenticated call refused" in logged
    assert not any(secret in logged for secret in (*TOKENS, "wrong-guess"))


async def test_a_valid_token_is_served_and_every_configured_token_works(
    start_server: StartServer, tokens_env: str
) -> None:
    server = await start_server(auth={"tokens_env": tokens_env})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for token, scheme in [(TOKENS[0], "Bearer"), (TOKENS[1], "bearer")]:
            reply = await stub(channel).Compare(
                COMPARE, metadata=_bearer(token, scheme), timeout=30
            )
            assert len(reply.rewards) == 2


async def test_health_stays_open_and_reflection_needs_the_token(
    start_server: StartServer, tokens_env: str
) -> None:
    server = await start_server(auth={"tokens_env": tokens_env})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(service="genrm.cohort.v1.CohortService"))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")

        with pytest.raises(grpc.RpcError) as caught:
            async for _ in reflection.ServerReflectionInfo(iter([ask]), timeout=10):
                pass
        assert rpc_code(caught.value) == grpc.StatusCode.UNAUTHENTICATED
        answers = [
            a
            async for a in reflection.ServerReflectionInfo(
                iter([ask]), metadata=_bearer(TOKENS[0]), timeout=10
            )
        ]
        names = {s.name for s in answers[0].list_services_response.service}
        assert "genrm.cohort.v1.CohortService" in names


async def test_token_auth_over_tls_with_call_credentials(
    start_server: StartServer, pki: Pki, tmp_path: pathlib.Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# rotated 2026-12\n\n{TOKENS[1]}\n")
    server = await start_server(
        tls={"cert_file": pki.server.cert, "key_file": pki.server.key},
        auth={"tokens_file": tokens},
    )
    # The standard gRPC way: access-token call credentials send "authorization: Bearer …".
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(root_certificates=pki.ca.cert_bytes()),
        grpc.access_token_call_credentials(TOKENS[1]),
    )
    async with grpc.aio.secure_channel(f"localhost:{server.port}", creds) as channel:
        reply = await stub(channel).Compare(COMPARE, timeout=30)
    assert len(reply.rewards) == 2
    async with tls_channel(server.port, pki.ca) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            await stub(channel).Compare(COMPARE, timeout=10)
    assert rpc_code(caught.value) == grpc.StatusCode.UNAUTHENTICATED


def test_token_sources_are_validated_at_start_up(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_GENRM_NO_TOKENS", raising=False)
    with pytest.raises(ConfigError, match="holds no token"):
        load_settings(auth={"tokens_env": "TEST_GENRM_NO_TOKENS"})
    empty = tmp_path / "empty"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(ConfigError, match="holds no token"):
        load_settings(auth={"tokens_file": empty})
    with pytest.raises(ConfigError, match="exactly one of tokens_file and tokens_env"):
        load_settings(auth={})
    monkeypatch.setenv("TEST_GENRM_BAD_TOKENS", "has space")
    with pytest.raises(ConfigError, match="printable ASCII") as caught:
        load_settings(auth={"tokens_env": "TEST_GENRM_BAD_TOKENS"})
    assert "has space" not in str(caught.value)  # a token never appears in an error
    monkeypatch.setenv("GENRM_AUTH__TOKENS_ENV", "TEST_GENRM_TOKENS")
    monkeypatch.setenv("TEST_GENRM_TOKENS", " a , b ,")
    settings = load_settings()
    assert settings.auth is not None and settings.auth.tokens() == ("a", "b")


def test_the_interceptor_compares_every_token() -> None:
    interceptor = TokenAuthInterceptor(["aaaa", "bbbb"])
    assert interceptor.authorized([("authorization", "Bearer bbbb")]) is None
    assert interceptor.authorized([("authorization", "Bearer bbbbb")]) == "invalid"
    assert interceptor.authorized([("authorization", "Bearer ")]) == "invalid"
    assert interceptor.authorized([("authorization", "Bearer bä")]) == "invalid"
    assert interceptor.authorized([("x-other", "Bearer aaaa")]) == "missing"
    assert interceptor.authorized(None) == "missing"
    with pytest.raises(ValueError):
        TokenAuthInterceptor([])
