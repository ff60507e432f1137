"""How the stores encode the core's records (``genrm_grpc/cohort/records.py``), and
the errors a store raises.

Keys, prompts and coordinates are encoded here as compact JSON; a tombstone
is stored as its own packed bytes (``Tombstone.record()``), the form the memory store
already keeps.

Keys are encoded generically from the :class:`CohortKey` dataclass fields, so a field
added to the key (a principal, say) is persisted without a schema change.
"""

from __future__ import annotations

import asyncio
import json

from genrm_grpc.cohort.model import (
    CohortKey,
    MemberCoords,
    PromptSpec,
)

#: How many recent timings a store keeps for tests, benchmarks and metrics.
RECENT_SAMPLES = 4096


def keep_recent(samples: list[float], value: float) -> None:
    """Append a timing, dropping the older half once ``RECENT_SAMPLES`` are kept."""
    if len(samples) >= RECENT_SAMPLES:
        del samples[: RECENT_SAMPLES // 2]
    samples.append(value)


class StoreError(Exception):
    """A store could not read or write: the affected calls fail, nothing is published."""


def copy_result(source: asyncio.Future[None], target: asyncio.Future[None]) -> None:
    """Resolve ``target`` as the write ``source`` ended (a cancelled write fails it)."""
    if target.done():
        return
    if source.cancelled():
        target.set_exception(StoreError("the store write was cancelled"))
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(None)


class StoreSchemaError(StoreError):
    """The store's file is unreadable or was written by a newer server: refuse to start."""


# ---------------------------------------------------------------------- encoding
# One encoder for every record: json.dumps with options builds a new one per call, which
# is most of the cost of encoding a key (~4 µs; ~1 µs through this one). Same output.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _dumps(value: object) -> str:
    return _ENCODER.encode(value)


def encode_key(key: CohortKey) -> str:
    """A stable text for a cohort key (the tuple of its fields, as JSON)."""
    # The fields by hand: dataclasses.astuple deep-copies and costs several µs per record.
    return _dumps([key.group_id, key.legacy_key, key.attempt, key.principal])


def decode_key(text: str) -> CohortKey:
    return CohortKey(*json.loads(text))


def encode_prompt(prompt: PromptSpec) -> str:
    return _dumps([[list(m) for m in prompt.messages], prompt.principle, prompt.baseline_response])


def decode_prompt(text: str) -> PromptSpec:
    messages, principle, baseline = json.loads(text)
    return PromptSpec(tuple((role, content) for role, content in messages), principle, baseline)


def encode_coords(coords: MemberCoords) -> str:
    c = coords
    return _dumps(
        [c.rollout_index, c.group_id, c.group_attempt, c.task_index, c.prompt_id, c.group_size]
    )


def decode_coords(text: str) -> MemberCoords:
    return MemberCoords(*json.loads(text))
