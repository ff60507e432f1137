"""The names of every Redis key the stores write, for the store and the replicas alike.

The layout and what each key holds are documented where they are written: the records'
keys in ``genrm_grpc.store.redis``, the replicas' in ``genrm_grpc.store.shared``. Here is
only how a name is made. Every key of a group carries the group's hash tag ``{T}`` (a
digest of the group scope, of the cohort key for a legacy cohort), so a group's keys
share one Redis Cluster hash slot; a deployment-wide key (an index, the counts, the
channel) carries none. ``<key>`` in a name is the cohort key as ASCII JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from genrm_grpc.cohort.model import CohortKey


def ascii_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# Field names read once: ``dataclasses.astuple`` deep-copies every value and cost ~20 µs
# per key (14 % of a replica's CPU per member in a profile).
_KEY_FIELDS = tuple(f.name for f in dataclasses.fields(CohortKey) if f.init)


def key_text(key: CohortKey) -> str:
    """The key as ASCII JSON of its fields (a field added to CohortKey needs no change)."""
    return ascii_json([getattr(key, name) for name in _KEY_FIELDS])


def key_from(member: bytes | str) -> CohortKey:
    """The cohort key of :func:`key_text` (an index member, a channel message)."""
    text = member.decode() if isinstance(member, bytes) else member
    return CohortKey(*json.loads(text))


def group_tag(scope: str) -> str:
    """The hash tag of a group scope (20 hex digits: no braces, bounded length)."""
    raw = ("s" + scope).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(raw, digest_size=10).hexdigest()


def cohort_tag(key: CohortKey) -> str:
    """The hash tag of a cohort: its group's, or its own for a legacy cohort."""
    scope = key.group_scope
    if scope is not None:
        return group_tag(scope)
    raw = ("l" + key_text(key)).encode("ascii")
    return hashlib.blake2b(raw, digest_size=10).hexdigest()


class Keys:
    """The key names under one prefix (``genrm`` unless the store was given another)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        # Deployment-wide, outside every group's hash slot.
        self.tombstone_index = f"{prefix}:it"
        self.watermark_index = f"{prefix}:iw"
        self.deadlines = f"{prefix}:dl"
        self.evaluations = f"{prefix}:ev"
        self.counts = f"{prefix}:n"
        self.channel = f"{prefix}:ended"

    def tagged(self, kind: str, key: CohortKey) -> str:
        """``PREFIX:<kind>:{T}``: a key of ``key``'s group."""
        return f"{self.prefix}:{kind}:{{{cohort_tag(key)}}}"

    # The records (genrm_grpc.store.redis).
    def cohort(self, key: CohortKey) -> str:
        return f"{self.tagged('c', key)}:{key_text(key)}"

    def verdicts(self, key: CohortKey) -> str:
        return f"{self.tagged('v', key)}:{key_text(key)}"

    def tombstone(self, key: CohortKey) -> str:
        return f"{self.tagged('t', key)}:{key_text(key)}"

    def reuse(self, key: CohortKey) -> str:
        return self.tagged("r", key)

    def reuse_of_scope(self, scope: str) -> str:
        return f"{self.prefix}:r:{{{group_tag(scope)}}}"

    def watermark(self, scope: str) -> str:
        return f"{self.prefix}:w:{{{group_tag(scope)}}}"

    # The replicas' (genrm_grpc.store.shared).
    def version(self, key: CohortKey) -> str:
        return self.tagged("g", key)

    def lease(self, key: CohortKey) -> str:
        return self.tagged("e", key)

    def fence(self, key: CohortKey) -> str:
        return self.tagged("x", key)

    def mailbox(self, key: CohortKey) -> str:
        return f"{self.tagged('o', key)}:{key_text(key)}"

    def attempt_heads(self, key: CohortKey) -> tuple[str, str, str]:
        """The cohort and tombstone key of another attempt of ``key``'s group are
        ``head + str(attempt) + tail``: the two heads and the tail (LOAD builds them)."""
        tag = cohort_tag(key)
        middle = "[" + ascii_json(key.group_id) + ",null,"
        tail = "," + ascii_json(key.principal) + "]"
        return f"{self.prefix}:c:{{{tag}}}:{middle}", f"{self.prefix}:t:{{{tag}}}:{middle}", tail
