"""DNS discovery against a real DNS server on loopback UDP (dnslib), whose records the
test changes while discovery runs; then a real ``serve`` process that follows them."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dnslib import AAAA, QTYPE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from genrm_grpc.judge.discovery import DiscoveryError, DnsDiscovery, endpoint_url

HOST = "genrm-headless.judges.test."


class Records(BaseResolver):  # type: ignore[misc]
    """A and AAAA records of one name, changeable at run time; NXDOMAIN otherwise."""

    def __init__(self) -> None:
        self.a: list[str] = []
        self.aaaa: list[str] = []
        self.silent = False
        self.lock = threading.Lock()

    def resolve(self, request: DNSRecord, handler: object) -> DNSRecord | None:
        reply = request.reply()
        qname = str(request.q.qname)
        if self.silent:
            return None  # no answer at all: the client times out
        with self.lock:
            a, aaaa = list(self.a), list(self.aaaa)
        if qname != HOST or not (a or aaaa):
            reply.header.rcode = 3  # NXDOMAIN
            return reply
        if request.q.qtype == QTYPE.A:
            for address in a:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=5))
        elif request.q.qtype == QTYPE.AAAA:
            for address in aaaa:
                reply.add_answer(RR(qname, QTYPE.AAAA, rdata=AAAA(address), ttl=5))
        return reply


@pytest.fixture
def dns_server() -> Iterator[tuple[Records, str]]:
    records = Records()
    quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
    server = DNSServer(records, port=0, address="127.0.0.1", logger=quiet)
    server.start_thread()
    port = server.server.server_address[1]
    try:
        yield records, f"127.0.0.1:{port}"
    finally:
        server.stop()
        server.server.server_close()  # dnslib's stop() leaves its socket open


def _discovery(nameserver: str, seen: list[tuple[str, ...]], **kw: object) -> DnsDiscovery:
    return DnsDiscovery(
        f"http://user:pw@{HOST.rstrip('.')}:8000/v1",
        interval_s=0.01,
        on_change=seen.append,
        nameserver=nameserver,
        timeout_s=0.3,
        **kw,  # type: ignore[arg-type]
    )


async def test_records_become_endpoints_and_changes_are_told_once(
    dns_server: tuple[Records, str],
) -> None:
    records, nameserver = dns_server
    records.a = ["10.0.0.2", "10.0.0.1"]
    seen: list[tuple[str, ...]] = []
    discovery = _discovery(nameserver, seen)
    await discovery.refresh()
    await discovery.refresh()  # unchanged: not told again
    records.a.append("10.0.0.3")
    await discovery.refresh()
    records.a.remove("10.0.0.1")
    await discovery.refresh()
    assert seen == [
        ("http://user:pw@10.0.0.1:8000/v1", "http://user:pw@10.0.0.2:8000/v1"),
        (
            "http://user:pw@10.0.0.1:8000/v1",
            "http://user:pw@10.0.0.2:8000/v1",
            "http://user:pw@10.0.0.3:8000/v1",
        ),
        ("http://user:pw@10.0.0.2:8000/v1", "http://user:pw@10.0.0.3:8000/v1"),
    ]


async def test_ipv6_records_are_bracketed(dns_server: tuple[Records, str]) -> None:
    records, nameserver = dns_server
    records.aaaa = ["fd00::5"]
    assert await _discovery(nameserver, []).resolve() == ("http://user:pw@[fd00::5]:8000/v1",)


async def test_an_unknown_name_is_a_clear_error(dns_server: tuple[Records, str]) -> None:
    _, nameserver = dns_server
    with pytest.raises(
        DiscoveryError, match=r"genrm-headless\.judges\.test resolved to no address"
    ):
        await _discovery(nameserver, []).resolve()


async def test_a_dns_server_that_stops_answering_keeps_the_last_set_and_warns_once(
    dns_server: tuple[Records, str], caplog: pytest.LogCaptureFixture
) -> None:
    records, nameserver = dns_server
    records.a = ["10.0.0.1"]
    seen: list[tuple[str, ...]] = []
    discovery = _discovery(nameserver, seen)
    await discovery.refresh()
    records.silent = True
    with caplog.at_level(logging.WARNING, logger="genrm_grpc.judge.discovery"):
        await discovery.refresh()
        await discovery.refresh()
    assert seen == [("http://user:pw@10.0.0.1:8000/v1",)]
    assert discovery.current == ("http://user:pw@10.0.0.1:8000/v1",)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "keeping the 1 judge endpoint" in warnings[0].getMessage()


def test_endpoint_urls_keep_scheme_userinfo_port_and_path() -> None:
    assert (
        endpoint_url("https://u:p@judge:9000/x/v1", "10.1.2.3") == "https://u:p@10.1.2.3:9000/x/v1"
    )
    assert endpoint_url("http://judge/v1", "fd00::1") == "http://[fd00::1]/v1"


def test_serve_follows_the_records_of_a_headless_service(
    dns_server: tuple[Records, str], tmp_path: Path
) -> None:
    """A real server: judge.url names a host whose A records point at farm nodes on
    loopback addresses; adding and removing a record mid-run moves the traffic."""
    from tests.e2e.test_judge_farm import NODE, _eventually, _run_groups
    from tests.judge.processes import FakeJudgeProcess, RestartableServer, free_port

    records, nameserver = dns_server
    port = free_port()
    # Two nodes on one port, on two loopback addresses: the records choose between them.
    first = FakeJudgeProcess(port, *NODE, host="127.0.0.2")
    second = FakeJudgeProcess(port, *NODE, host="127.0.0.3")
    records.a = ["127.0.0.2"]
    with first, second:
        server = RestartableServer(
            "memory://",
            f"http://{HOST.rstrip('.')}:{port}",
            tmp_path / "server.log",
            GENRM_JUDGE__DISCOVERY="dns",
            GENRM_JUDGE__DISCOVERY_NAMESERVER=nameserver,
            GENRM_JUDGE__DISCOVERY_INTERVAL_S="0.1",
            GENRM_JUDGE_PROBE="off",
        )
        server.start()
        try:
            asyncio.run(_run_groups(server.target, 4, 4))
            assert _total(first) == 16 and _total(second) == 0
            records.a = ["127.0.0.2", "127.0.0.3"]
            _eventually(lambda: "127.0.0.3" in _endpoints(server))
            records.a = ["127.0.0.3"]
            _eventually(lambda: "127.0.0.2" not in _endpoints(server))
            before = _total(first)
            asyncio.run(_run_groups(server.target, 4, 4, first=100))
            assert _total(first) == before and _total(second) >= 16
        finally:
            server.close()


def _total(node: object) -> int:
    return int(node.stats()["total"])  # type: ignore[attr-defined]


def _endpoints(server: object) -> str:
    import urllib.request

    url = "http://" + server.env["GENRM_METRICS_LISTEN"] + "/metrics"  # type: ignore[attr-defined]
    with urllib.request.urlopen(url, timeout=10) as reply:
        text: str = reply.read().decode()
    return "\n".join(
        line
        for line in text.splitlines()
        if line.startswith("genrm_judge_endpoint_state{")
        and line.endswith(" 1.0")
        and 'state="draining"' not in line
    )
