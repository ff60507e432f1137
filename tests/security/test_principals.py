"""Principals: every cohort key includes the authenticated caller, quotas are per caller."""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
from typing import Any

import grpc
import pytest
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

from genrm_grpc.config import ConfigError, load_settings, token_principal
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer

from .conftest import PROMPT, Pki, StartServer, details, stub, tls_channel

ALICE = (("authorization", "Bearer alice-s3cret-token"),)
BOB = (("authorization", "Bearer bob-s3cret-token"),)
TOKENS_FILE = "alice:alice-s3cret-token\nbob:bob-s3cret-token\n"


@pytest.fixture
def tokens(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "tokens"
    path.write_text(TOKENS_FILE)
    return path


def _member(index: int, answer: str, *, group: str = "g", attempt: int = 0) -> Any:
    return pb.SubmitMemberRequest(
        member=pb.MemberRef(
            group_id=group, group_attempt=attempt, rollout_index=index, group_size=2
        ),
        prompt=PROMPT,
        candidate=pb.Candidate(output_text=answer),
    )


def test_tokens_file_lines_name_principals_and_bare_tokens_get_a_hash_name(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\nalice:tok-a\n\nalice:tok-a2\nbare-old-token\nbob:with:colon\n")
    settings = load_settings(auth={"tokens_file": path})
    assert settings.auth is not None
    principals = settings.auth.principals()
    bare = "token-" + hashlib.sha256(b"bare-old-token").hexdigest()[:16]
    assert principals == {
        "tok-a": "alice",
        "tok-a2": "alice",
        "bare-old-token": bare,
        "with:colon": "bob",
    }
    assert token_principal("bare-old-token") == bare
    assert "bare-old-token" not in bare


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("bad name:tok-1\n", "line 1: the principal"),
        ("a:tok-1\nb:tok-1\n", "line 2: the same token is listed for two principals"),
        ("a:\n", "line 1: tokens must be printable ASCII"),
    ],
)
def test_bad_tokens_file_lines_are_one_clear_error_that_never_quotes_a_token(
    tmp_path: pathlib.Path, text: str, needle: str
) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(auth={"tokens_file": path})
    assert needle in str(caught.value)
    assert "tok-1" not in str(caught.value)


async def test_two_principals_with_the_same_group_ids_never_meet(
    start_server: StartServer, tokens: pathlib.Path
) -> None:
    server = await start_server(auth={"tokens_file": tokens})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = stub(channel)
        # Bob fences group "g" as far as it goes and squats on its first slot...
        fence = _member(0, "Bob's answer.", attempt=2**32 - 1)
        bob_first = asyncio.ensure_future(cohorts.SubmitMember(fence, metadata=BOB, timeout=30))
        bob_slot = asyncio.ensure_future(
            cohorts.SubmitMember(_member(0, "Bob's."), metadata=BOB, timeout=30)
        )
        # ...and Alice's attempt 0 of "g" is neither superseded nor in conflict.
        alice = await asyncio.gather(
            cohorts.SubmitMember(_member(0, "Seven."), metadata=ALICE, timeout=30),
            cohorts.SubmitMember(_member(1, "Four."), metadata=ALICE, timeout=30),
        )
        assert [r.result.member.rollout_index for r in alice] == [0, 1]
        assert not any(r.result.mask_sample for r in alice)
        # Alice sees her cohort; Bob's view of "g" is his own attempt, never Alice's.
        mine = await cohorts.GetCohort(
            pb.GetCohortRequest(member=pb.MemberRef(group_id="g", group_attempt=0)),
            metadata=ALICE,
            timeout=10,
        )
        assert mine.cohort.phase == pb.COHORT_PHASE_COMPLETED
        assert mine.cohort.key.endswith("@alice")
        theirs = await cohorts.GetCohort(
            pb.GetCohortRequest(member=pb.MemberRef(group_id="g")), metadata=BOB, timeout=10
        )
        assert theirs.cohort.latest_attempt == 2**32 - 1
        assert theirs.cohort.key.endswith("@bob")
        assert not bob_first.done()
        bob_first.cancel()
        # Bob's own attempt 0 is fenced by his own fence (whichever of his two calls the
        # server saw first), never by anything of Alice's.
        with pytest.raises(grpc.RpcError) as caught:
            await bob_slot
        info = details(caught.value).info
        assert info is not None and info.reason in ("ATTEMPT_SUPERSEDED", "COHORT_FAILED")


async def test_get_cohort_of_another_principals_cohort_is_not_found(
    start_server: StartServer, tokens: pathlib.Path
) -> None:
    server = await start_server(auth={"tokens_file": tokens})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = stub(channel)
        await asyncio.gather(
            cohorts.SubmitMember(_member(0, "Seven.", group="private"), metadata=ALICE, timeout=30),
            cohorts.SubmitMember(_member(1, "Four.", group="private"), metadata=ALICE, timeout=30),
        )
        with pytest.raises(grpc.RpcError) as caught:
            await cohorts.GetCohort(
                pb.GetCohortRequest(member=pb.MemberRef(group_id="private", group_attempt=0)),
                metadata=BOB,
                timeout=10,
            )
        got = details(caught.value)
        assert got.code == grpc.StatusCode.NOT_FOUND
        assert got.info is not None and got.info.reason == "COHORT_NOT_FOUND"


async def test_active_cohorts_are_bounded_per_principal(
    start_server: StartServer, tokens: pathlib.Path
) -> None:
    server = await start_server(auth={"tokens_file": tokens}, max_active_cohorts_per_principal=1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = stub(channel)
        alice_stream = cohorts.StreamGroups(metadata=ALICE, timeout=30)
        await alice_stream.write(pb.StreamGroupsRequest(member=_member(0, "a", group="g1")))
        assert (await alice_stream.read()).WhichOneof("event") == "accepted"
        await alice_stream.write(pb.StreamGroupsRequest(member=_member(0, "a", group="g2")))
        refused = await alice_stream.read()
        assert refused.WhichOneof("event") == "error"
        assert refused.error.status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert "max_active_cohorts_per_principal=1" in refused.error.status.message
        # Bob's quota is his own.
        bob_stream = cohorts.StreamGroups(metadata=BOB, timeout=30)
        await bob_stream.write(pb.StreamGroupsRequest(member=_member(0, "b", group="g1")))
        assert (await bob_stream.read()).WhichOneof("event") == "accepted"
        # A newer attempt of Alice's own group replaces the old one: within her quota.
        await alice_stream.write(
            pb.StreamGroupsRequest(member=_member(0, "a", group="g1", attempt=1))
        )
        events = [(await alice_stream.read()).WhichOneof("event") for _ in range(2)]
        assert sorted(events) == ["accepted", "error"]  # accepted + attempt 0's ABORTED
        alice_stream.cancel()
        bob_stream.cancel()


async def test_quota_refusals_name_the_principal_in_error_info(
    start_server: StartServer, tokens: pathlib.Path
) -> None:
    server = await start_server(auth={"tokens_file": tokens}, max_active_cohorts_per_principal=1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        cohorts = stub(channel)
        first = cohorts.StreamGroups(metadata=ALICE, timeout=30)
        await first.write(pb.StreamGroupsRequest(member=_member(0, "a", group="q1")))
        assert (await first.read()).WhichOneof("event") == "accepted"  # q1 is active
        with pytest.raises(grpc.RpcError) as caught:
            await cohorts.SubmitMember(_member(0, "a", group="q2"), metadata=ALICE, timeout=30)
        got = details(caught.value)
        assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert got.info is not None and got.info.reason == "CAPACITY_EXHAUSTED"
        assert got.info.metadata["principal"] == "alice"
        first.cancel()


async def test_compare_passes_in_flight_are_bounded_per_principal(
    tokens: pathlib.Path,
) -> None:
    # The judge never answers: Compare calls stay in flight until cancelled.
    with FakeJudgeServer(FakeJudgeConfig(hang_rate=1.0)) as judge:
        settings = load_settings(
            listen="127.0.0.1:0",
            judge={"url": judge.url},
            auth={"tokens_file": tokens},
            max_compare_passes_per_principal=4,
            shutdown_grace_s=0.5,
        )
        server = CohortServer(settings)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                cohorts = pb_grpc.CohortServiceStub(channel)
                four = pb.CompareRequest(
                    prompt=PROMPT,
                    candidates=[pb.Candidate(output_text=f"answer {k}") for k in range(4)],
                )
                alice_first = asyncio.ensure_future(
                    cohorts.Compare(four, metadata=ALICE, timeout=30)
                )
                # Its 4 passes reached the judge: it is admitted and in flight.
                assert await asyncio.to_thread(judge.wait_for_requests, 4, 30)
                with pytest.raises(grpc.RpcError) as caught:
                    await cohorts.Compare(four, metadata=ALICE, timeout=30)
                got = details(caught.value)
                assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert got.info is not None and got.info.reason == "CAPACITY_EXHAUSTED"
                assert got.info.metadata["principal"] == "alice"
                bob = asyncio.ensure_future(cohorts.Compare(four, metadata=BOB, timeout=30))
                assert await asyncio.to_thread(judge.wait_for_requests, 8, 30)  # Bob's too
                assert not bob.done() and not alice_first.done()
                alice_first.cancel()
                bob.cancel()
        finally:
            await server.stop()


async def test_client_certificates_name_principals_that_never_meet(
    start_server: StartServer, pki: Pki, tmp_path: pathlib.Path
) -> None:
    from .certs import CertificateAuthority

    (tmp_path / "named").mkdir()
    ca = CertificateAuthority(tmp_path / "named", "named-ca")
    alice, bob = ca.issue("alice", server=False), ca.issue("bob", server=False)
    server_pem = ca.issue("server", server=True)
    server = await start_server(
        tls={
            "cert_file": server_pem.cert,
            "key_file": server_pem.key,
            "client_ca_file": ca.pem.cert,
            "require_client_auth": True,
        }
    )
    async with (
        tls_channel(server.port, ca.pem, alice) as as_alice,
        tls_channel(server.port, ca.pem, bob) as as_bob,
    ):
        await asyncio.gather(
            stub(as_alice).SubmitMember(_member(0, "Seven.", group="m"), timeout=30),
            stub(as_alice).SubmitMember(_member(1, "Four.", group="m"), timeout=30),
        )
        mine = await stub(as_alice).GetCohort(
            pb.GetCohortRequest(member=pb.MemberRef(group_id="m", group_attempt=0)), timeout=10
        )
        assert mine.cohort.key.endswith("@alice")
        with pytest.raises(grpc.RpcError) as caught:
            await stub(as_bob).GetCohort(
                pb.GetCohortRequest(member=pb.MemberRef(group_id="m", group_attempt=0)),
                timeout=10,
            )
        assert details(caught.value).code == grpc.StatusCode.NOT_FOUND
