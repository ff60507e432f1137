"""What one read of a group returns and what its commit answers, for every group store.

``genrm_grpc.runtime.group_store.GroupStore`` is the seam a replica's runtime decides
through; its implementations (``genrm_grpc.store.shared`` over Redis,
``genrm_grpc.store.local`` in process) return these values. Nothing here imports a
store client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genrm_grpc.cohort.model import CohortKey
from genrm_grpc.cohort.records import Recovered

#: How long an ended cohort's outcome stays in its mailbox for waiters elsewhere (an
#: explicit cohort's tombstone outlives it; a completed legacy cohort has none).
MAILBOX_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class GroupState:
    """A group as one read saw it: what a registry holding only this group restores."""

    key: CohortKey
    version: str
    recovered: Recovered
    #: Active cohorts in the deployment, and the key's principal's, this group's included.
    active_total: int
    active_principal: int
    #: The group's active cohorts when they are known otherwise than by ``recovered``
    #: (a replica deciding on the state of its own last commit).
    known_active: frozenset[CohortKey] | None = None

    def at_version(self, version: str) -> GroupState:
        """This state as a commit left it, at ``version``."""
        return GroupState(
            self.key,
            version,
            self.recovered,
            self.active_total,
            self.active_principal,
            self.known_active,
        )

    def knowing(self, active: frozenset[CohortKey]) -> GroupState:
        """This state with its active cohorts known to be ``active``."""
        return GroupState(
            self.key, self.version, self.recovered, self.active_total, self.active_principal, active
        )

    @property
    def active_keys(self) -> frozenset[CohortKey]:
        if self.known_active is not None:
            return self.known_active
        return frozenset(c.header.key for c in self.recovered.cohorts)


@dataclass(frozen=True, slots=True)
class Committed:
    """``written``: the records are in the store. ``token``: the evaluation lease it took.
    ``version``: the group's version after the commit (a store decides how versions
    grow), what the next decision on the state it left must be checked against."""

    written: bool
    lease_lost: bool = False
    token: int = 0
    version: str = ""


@dataclass
class SharedStats:
    loads: int = 0
    commits: int = 0
    conflicts: int = 0
    leases_lost: int = 0
    takeovers: int = 0
    renewals: int = 0
    #: Writes that failed (Redis did not answer or refused; the file behind failed).
    failures: int = 0
    #: The deployment's active cohorts at the last group read.
    active_seen: int = 0
    #: Seconds of recent round trips, for the store-latency metric (bounded).
    latencies: list[float] = field(default_factory=list)
