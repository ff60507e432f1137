"""Per-group leases with fencing tokens, on Redis: who may write a group's state.

Groundwork for replicas sharing one Redis (issue 14); nothing in the server takes a
lease yet. A replica that evaluates a group holds the group's lease and renews it; any
write it makes to the group's state goes through :meth:`GroupLeases.fenced_write`,
which Redis applies only while the writer's lease is still the current one. A replica
that paused (a long GC, SIGSTOP, a VM migration) or lost Redis for longer than its
lease can therefore never write — nor publish, when publishing is such a write —
afterwards: another replica may have taken the group over, and the stale holder's
token no longer matches.

Keys (same hash tag ``{T}`` as the group's records, so a fenced write touching the
group's keys is one Cluster slot):

- ``genrm:l:{T}`` — the lease: ``"<token>:<owner>"`` with a ``PX`` expiry;
- ``genrm:f:{T}`` — the group's fencing counter, ``INCR``'d at every acquisition, so
  tokens of one group only grow. It expires ``fence_retention_s`` after the group's
  last acquisition (a day by default): a counter is kept per group, not forever. A reset
  cannot let a stale holder in, because a write must present the lease's exact value,
  token *and* owner, and each acquisition has its own owner nonce.

Every operation is one Lua script, so one round trip, and every script is idempotent
for its arguments: redis-py's retry after a lost reply replays it without effect
(re-acquiring with the same owner nonce returns the same token).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from genrm_grpc.store.records import StoreError
from genrm_grpc.store.redis import PREFIX, RedisUnavailableError, group_tag

_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)

# KEYS: lease, fence counter. ARGV: owner, lease ms, fence retention ms.
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local tok, who = string.match(cur, '^(%d+):(.*)$')
  if who == ARGV[1] then return tonumber(tok) end
  return false
end
local tok = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], tok .. ':' .. ARGV[1], 'PX', ARGV[2])
return tok
"""

# KEYS: lease. ARGV: the holder's value, lease ms.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS: lease, then one key per operation. ARGV: the holder's value, then per operation
# its command, its argument count and its arguments. All or nothing: checked first.
_FENCED_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local a = 2
for i = 2, #KEYS do
  local n = tonumber(ARGV[a + 1])
  local args = {}
  for k = 1, n do args[k] = ARGV[a + 1 + k] end
  redis.call(ARGV[a], KEYS[i], unpack(args))
  a = a + 2 + n
end
return 1
"""

#: The commands a fenced write may run (each on one key, the operation's first item).
FENCED_COMMANDS = frozenset(
    {"SET", "DEL", "HSET", "HDEL", "PEXPIRE", "PEXPIREAT", "RPUSH", "XADD", "INCRBY"}
)

FencedOp = Sequence[str | bytes | int | float]


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease: present it to renew, release or write. ``token`` only grows per group."""

    scope: str
    owner: str
    token: int
    valid_until: float  # time.monotonic() at which the holder must assume it is gone
    #: The Redis key of the lease when it is not the group's ``genrm:l:{T}`` (a
    #: replica's evaluation lease, ``genrm:e:{T}``); fenced batches check this key.
    key: str = ""

    @property
    def value(self) -> str:
        return f"{self.token}:{self.owner}"


class GroupLeases:
    """Acquire, renew, release group leases and write under them, for one replica."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        replica: str,
        address: str,
        prefix: str = PREFIX,
        fence_retention_s: float = 86_400.0,
    ) -> None:
        self._client = client
        self.replica = replica
        self.address = address
        self._prefix = prefix
        self._fence_retention_ms = int(fence_retention_s * 1000)
        self.round_trips = 0

    def lease_key(self, scope: str) -> str:
        return f"{self._prefix}:l:{{{group_tag(scope)}}}"

    def fence_key(self, scope: str) -> str:
        return f"{self._prefix}:f:{{{group_tag(scope)}}}"

    async def acquire(self, scope: str, ttl_s: float) -> Lease | None:
        """The group's lease with a new, larger token; None while another holder has it."""
        owner = f"{self.replica}/{uuid.uuid4().hex}"
        started = time.monotonic()
        token = await self._eval(
            _ACQUIRE,
            [self.lease_key(scope), self.fence_key(scope)],
            [owner, _ms(ttl_s), max(self._fence_retention_ms, _ms(ttl_s))],
        )
        if not isinstance(token, int):
            return None  # nil: someone else holds it
        return Lease(scope, owner, token, started + ttl_s)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        """The lease extended by ``ttl_s`` from now; None when it was lost (stop work)."""
        started = time.monotonic()
        renewed = await self._eval(_RENEW, [self.lease_key(lease.scope)], [lease.value, _ms(ttl_s)])
        if renewed != 1:
            return None
        return Lease(lease.scope, lease.owner, lease.token, started + ttl_s)

    async def release(self, lease: Lease) -> bool:
        """Give the lease up; False when it was no longer this holder's (nothing changes)."""
        released = await self._eval(_RELEASE, [self.lease_key(lease.scope)], [lease.value])
        return released == 1

    async def holder(self, scope: str) -> tuple[int, str] | None:
        """The current (token, owner) of the group's lease, if anyone holds it."""
        self.round_trips += 1
        try:
            raw = await self._client.get(self.lease_key(scope))
        except _UNAVAILABLE as exc:
            raise RedisUnavailableError(f"the store {self.address} is unreachable: {exc}") from exc
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        token, owner = text.split(":", 1)
        return int(token), owner

    async def fenced_write(self, lease: Lease, ops: Sequence[FencedOp]) -> bool:
        """Apply ``ops`` atomically only if ``lease`` is still the group's current lease.

        False (nothing written) when it is not: the lease expired or was taken over.
        Each operation is ``(COMMAND, key, *args)`` with a command of FENCED_COMMANDS.
        """
        keys = [self.lease_key(lease.scope)]
        args: list[str | bytes | int | float] = [lease.value]
        for op in ops:
            command, key, *rest = op
            command = str(command).upper()
            if command not in FENCED_COMMANDS or not isinstance(key, str):
                raise ValueError(f"{op[:2]!r} is not (a fenced write command, a key)")
            keys.append(key)
            args.extend([command, len(rest), *rest])
        return await self._eval(_FENCED_WRITE, keys, args) == 1

    async def _eval(
        self, script: str, keys: list[str], args: Sequence[str | bytes | int | float]
    ) -> object:
        self.round_trips += 1
        try:
            result: object = await self._client.eval(script, len(keys), *keys, *args)
        except _UNAVAILABLE as exc:
            raise RedisUnavailableError(f"the store {self.address} is unreachable: {exc}") from exc
        except RedisError as exc:
            raise StoreError(f"the store {self.address} refused a lease operation: {exc}") from exc
        return result


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
