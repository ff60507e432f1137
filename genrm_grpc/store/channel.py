"""The replicas' channel: what a group commit publishes, and the subscriber that hears it.

A commit (``genrm_grpc.store.shared``, script ``COMMIT`` of ``genrm_grpc.store.lua``)
publishes, after its writes, the key of every cohort it ended (:func:`ended_message`)
and, under eager judging, ``GROWN`` + the key of every cohort that gained members or
froze (:func:`grown_message`). Redis pub/sub is at-most-once: a message published while
a replica is not subscribed is lost, so :func:`listen` tells its caller of every
(re)subscription and the caller re-reads what it waits for.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from genrm_grpc.cohort.model import CohortKey
from genrm_grpc.store.records import StoreError
from genrm_grpc.store.redis import UNAVAILABLE
from genrm_grpc.store.redis_keys import key_from, key_text

log = logging.getLogger(__name__)
#: Jitter from a generator of its own, not the ``random`` module's shared one: a
#: process that seeds ``random`` for a reproducible run draws the same numbers
#: whether or not the channel reconnected.
_JITTER = random.Random()

#: Prefix of a channel message announcing that a cohort grew (eager judging); a message
#: without it names a cohort that ended.
GROWN = "+"


def ended_message(key: CohortKey) -> str:
    return key_text(key)


def grown_message(key: CohortKey) -> str:
    return GROWN + key_text(key)


async def listen(
    url: str,
    address: str,
    channel: str,
    on_ended: Callable[[CohortKey], None],
    on_subscribed: Callable[[], Awaitable[None]],
    *,
    stopping: asyncio.Event,
    on_grown: Callable[[CohortKey], None] | None = None,
) -> None:
    """Deliver ``channel``'s messages until ``stopping``; resubscribe after a drop
    (``address``: the store's, without a password, for the log).

    A cohort that ended goes to ``on_ended``, one that grew to ``on_grown``.
    ``on_subscribed`` runs after every (re)subscription.
    """
    # A connection of its own, without redis-py's transparent retry: a subscriber whose
    # connection was cut must learn it (and re-read), not be reconnected silently with
    # the messages of the gap lost.
    listener = aioredis.Redis.from_url(url, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
    try:
        await _listen(listener, address, channel, on_ended, on_grown, on_subscribed, stopping)
    finally:
        await listener.aclose()


async def _listen(
    listener: aioredis.Redis,
    address: str,
    channel: str,
    on_ended: Callable[[CohortKey], None],
    on_grown: Callable[[CohortKey], None] | None,
    on_subscribed: Callable[[], Awaitable[None]],
    stopping: asyncio.Event,
) -> None:
    backoff = 0.05
    while not stopping.is_set():
        pubsub = listener.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            backoff = 0.05
            await on_subscribed()
            while not stopping.is_set():
                message = await pubsub.get_message(timeout=0.5)
                if message is not None and message.get("type") == "message":
                    try:
                        _dispatch(message["data"], on_ended, on_grown)
                    except (ValueError, TypeError):
                        log.warning("ignored a malformed message on %s", channel)
        except (*UNAVAILABLE, RedisError, StoreError) as exc:
            log.warning("lost the replicas' channel on %s: %s", address, exc)
            await asyncio.sleep(backoff + _JITTER.uniform(0, backoff))
            backoff = min(backoff * 2, 1.0)
        finally:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except (*UNAVAILABLE, RedisError):
                pass


def _dispatch(
    data: bytes | str,
    on_ended: Callable[[CohortKey], None],
    on_grown: Callable[[CohortKey], None] | None,
) -> None:
    text = data.decode() if isinstance(data, bytes) else data
    if text.startswith(GROWN):
        if on_grown is not None:
            on_grown(key_from(text[len(GROWN) :]))
    else:
        on_ended(key_from(text))
