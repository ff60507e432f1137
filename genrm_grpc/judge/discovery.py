"""DNS discovery of judge endpoints (``judge.discovery: dns``).

The host of ``judge.url`` is resolved every ``judge.discovery_interval_s``; every A and
AAAA record becomes one endpoint URL with the configured URL's scheme, user-info, port
and path (a Kubernetes headless Service answers with one A record per ready pod). The
farm is told the new set only when it changes: new addresses join, vanished ones drain
(``Farm.set_urls``). A failed resolution keeps the last known set and logs one warning
(then one a minute while it keeps failing): an empty answer never empties the farm.

dnspython's asyncio resolver does the lookups (A and AAAA, a chosen nameserver):
asyncio's ``getaddrinfo`` runs in a thread per lookup and cannot ask another server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable

import dns.asyncresolver
import dns.exception
import dns.resolver

log = logging.getLogger(__name__)

WARN_EVERY_S = 60.0


class DiscoveryError(Exception):
    """The judge host could not be resolved to any address."""


def endpoint_url(url: str, address: str) -> str:
    """``url`` with its host replaced by ``address`` (IPv6 in brackets)."""
    parts = urllib.parse.urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class DnsDiscovery:
    def __init__(
        self,
        url: str,
        *,
        interval_s: float,
        on_change: Callable[[tuple[str, ...]], None],
        nameserver: str | None = None,
        timeout_s: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        host = urllib.parse.urlsplit(url).hostname
        if not host:
            raise DiscoveryError("judge.url names no host to resolve")
        self.host = host
        self.interval_s = interval_s
        self._on_change = on_change
        self._sleep = sleep
        self._clock = clock
        self._resolver = dns.asyncresolver.Resolver(configure=nameserver is None)
        if nameserver is not None:
            address, _, port = nameserver.rpartition(":")
            self._resolver.nameservers = [address.strip("[]")]
            self._resolver.port = int(port)
        self._resolver.lifetime = timeout_s
        self._resolver.timeout = timeout_s
        self.current: tuple[str, ...] | None = None
        self._failing_since: float | None = None
        self._warned_at: float | None = None

    async def resolve(self) -> tuple[str, ...]:
        """Every address of the host as an endpoint URL, sorted; raises DiscoveryError."""
        addresses: set[str] = set()
        errors: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(self.host, rdtype, search=False)
            except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN) as exc:
                errors.append(f"{rdtype}: {type(exc).__name__}")
                continue
            except dns.exception.DNSException as exc:
                errors.append(f"{rdtype}: {exc}")
                continue
            addresses.update(record.to_text() for record in answer)
        if not addresses:
            raise DiscoveryError(
                f"judge.discovery: {self.host} resolved to no address ({'; '.join(errors)})"
            )
        return tuple(sorted(endpoint_url(self.url, a) for a in addresses))

    async def refresh(self) -> None:
        """One resolution; tells the farm when the set changed. Never raises."""
        try:
            urls = await self.resolve()
        except DiscoveryError as exc:
            now = self._clock()
            if self._failing_since is None:
                self._failing_since = now
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "%s; keeping the %s judge endpoint(s) known before",
                    exc,
                    "no" if self.current is None else len(self.current),
                    extra={"judge_event": "discovery_failed"},
                )
            return
        self._failing_since = self._warned_at = None
        if urls != self.current:
            log.info(
                "judge discovery: %s has %d address(es)",
                self.host,
                len(urls),
                extra={"judge_event": "discovered", "judge_endpoints": len(urls)},
            )
            self.current = urls
            self._on_change(urls)

    async def run(self) -> None:
        while True:
            await self.refresh()
            await self._sleep(self.interval_s)


__all__ = ["DiscoveryError", "DnsDiscovery", "endpoint_url"]
