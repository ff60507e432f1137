"""A lease with a fencing token: what a replica presents to write under it.

A replica that evaluates a cohort of a shared Redis store holds the cohort's
*evaluation lease* (``genrm:e:{T}``, taken, renewed, released and claimed by the scripts
of ``genrm_grpc.store.shared``). The lease's value in Redis is ``"<token>:<owner>"``:
``token`` comes from the group's fencing counter, so it only grows, and ``owner`` names
the replica (host, pid and a nonce). Everything the evaluator writes presents that value
and is applied only while it is still the lease's current value — its journal batches
(``RedisStore.persist(records, lease=...)``) and its outcome (the group commit) — so a
replica that paused (a long GC, SIGSTOP, a VM migration) or lost Redis past its lease
can never write, nor publish, afterwards: another replica may have taken the cohort
over, and the stale holder's value no longer matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from genrm_grpc.store.records import StoreError


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease: present it to renew, release or write. ``token`` only grows per group."""

    scope: str
    owner: str
    token: int
    valid_until: float  # time.monotonic() at which the holder must assume it is gone
    #: The lease's Redis key (``genrm:e:{T}``); a fenced batch writes only keys of the
    #: same hash tag.
    key: str

    @property
    def value(self) -> str:
        return f"{self.token}:{self.owner}"


class LeaseLostError(StoreError):
    """A fenced batch's lease is no longer the group's current one: nothing was written."""
