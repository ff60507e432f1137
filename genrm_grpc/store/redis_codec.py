"""The records as Redis holds them: encoding a batch into the store's operations, and
decoding what a read returns.

One side writes (:func:`encode_ops`: the keys and arguments ``apply_ops`` of
``genrm_grpc.store.lua`` takes; :func:`index_ops`: the replicas' indexes a group commit
keeps), the other reads (``decode_*``: the start-up read of
``genrm_grpc.store.redis``; :func:`digest_group`: a replica's group read of
``genrm_grpc.store.shared``), so a change of a value's layout is made here on both
sides. The layout of each key is documented in ``genrm_grpc.store.redis``; a verdict's
JSON and its reuse-index entry are strings Lua never re-encodes (cjson would round the
numbers).
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from collections.abc import Sequence
from typing import Any

from genrm_grpc.cohort.model import CohortKey, MemberCoords, Phase, PromptSpec, Tombstone
from genrm_grpc.cohort.records import (
    CohortRecord,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    Record,
    Recovered,
    RecoveredCohort,
    TombstoneRecord,
    VerdictRecord,
    WatermarkRecord,
)
from genrm_grpc.scoring.types import AnswerTexts, Verdict
from genrm_grpc.store.records import decode_prompt
from genrm_grpc.store.redis_keys import Keys, ascii_json, key_from, key_text

#: A tombstone's value starts with its expiry (wall-clock seconds).
EXPIRY = struct.Struct("<d")
# Field names read once (see redis_keys._KEY_FIELDS).
_COORDS_FIELDS = tuple(f.name for f in dataclasses.fields(MemberCoords))


def ms(instant: float) -> int:
    """Seconds as the whole milliseconds Redis takes (``PXAT``, scores), at least 1."""
    return max(1, int(instant * 1000))


def question(context: str, first: str, second: str, judge_index: int, swap: bool) -> str:
    return f"{context}:{first}:{second}:{judge_index}:{int(swap)}"


def _verdict_question(record: VerdictRecord) -> str | None:
    if record.scope is None:
        return None
    return question(record.context, record.first, record.second, record.judge_index, record.swap)


def _verdict_json(record: VerdictRecord) -> str:
    v = record.verdict
    return ascii_json(
        {
            "c": json.loads(key_text(record.cohort)),
            "s": record.scope,
            "x": record.context,
            "f": record.first,
            "n": record.second,
            "k": record.judge_index,
            "w": record.swap,
            "i": record.response_i,
            "j": record.response_j,
            "v": [v.score_1, v.score_2, v.ranking, v.parse_failed],
            "u": None if record.usage is None else list(record.usage),
            "t": record.finished_at,
        }
    )


def _reuse_entry(record: VerdictRecord) -> str:
    """What the reuse index keeps of a verdict: the rest is the question it is filed under."""
    v = record.verdict
    usage = None if record.usage is None else list(record.usage)
    return ascii_json(
        [
            record.response_i,
            record.response_j,
            [v.score_1, v.score_2, v.ranking, v.parse_failed],
            usage,
            record.finished_at,
        ]
    )


def verdict_from(raw: str | bytes) -> VerdictRecord:
    d = json.loads(raw)
    s1, s2, rank, failed = d["v"]
    usage = d["u"]
    return VerdictRecord(
        cohort=CohortKey(*d["c"]),
        scope=d["s"],
        context=d["x"],
        first=d["f"],
        second=d["n"],
        judge_index=d["k"],
        swap=bool(d["w"]),
        response_i=d["i"],
        response_j=d["j"],
        verdict=Verdict(s1, s2, rank, bool(failed)),
        usage=None if usage is None else (usage[0], usage[1], usage[2]),
        finished_at=d["t"],
    )


def reuse_verdict(
    raw: bytes | str,
    scope: str,
    context: str,
    first: str,
    second: str,
    judge_index: int,
    swap: bool,
) -> VerdictRecord | None:
    """The first verdict of a reuse-index entry on that question, if it holds one."""
    holders = json.loads(raw)
    if not holders:
        return None
    cohort, entry = holders[0]
    i, j, (s1, s2, rank, failed), usage, finished = json.loads(entry)
    return VerdictRecord(
        cohort=CohortKey(*json.loads(cohort)),
        scope=scope,
        context=context,
        first=first,
        second=second,
        judge_index=judge_index,
        swap=swap,
        response_i=i,
        response_j=j,
        verdict=Verdict(s1, s2, rank, bool(failed)),
        usage=None if usage is None else (usage[0], usage[1], usage[2]),
        finished_at=finished,
    )


def _prompt_json(prompt: PromptSpec) -> list[object]:
    return [[list(m) for m in prompt.messages], prompt.principle, prompt.baseline_response]


def _coords_json(coords: MemberCoords) -> list[object]:
    return [getattr(coords, name) for name in _COORDS_FIELDS]


def encode_ops(
    records: Sequence[Record], keys: Keys, max_tombstones: int
) -> tuple[list[str], list[str | bytes | int]]:
    """The keys and arguments of ``apply_ops`` (``lua.OPS``) that write ``records``;
    a tombstone beyond ``max_tombstones`` retained (0: no bound) drops the oldest."""
    names: list[str] = []
    args: list[str | bytes | int] = []
    for record in records:
        if not _cohort_ops(record, keys, names, args) and not _retention_ops(
            record, keys, max_tombstones, names, args
        ):
            raise TypeError(f"not a store record: {record!r}")
    return names, args


def _cohort_ops(
    record: Record, keys: Keys, names: list[str], args: list[str | bytes | int]
) -> bool:
    """A member, verdict, header or dropped cohort's ops; False for other records."""
    if isinstance(record, MemberRecord):
        coords = _coords_json(record.coords)
        member = [coords, record.digest, record.texts.reasoning, record.texts.answer]
        slot = record.coords.rollout_index
        name = keys.cohort(record.key)
        # ``d:`` repeats coordinates and digest without the texts: what a replica
        # reads to decide about a group (genrm_grpc.store.shared).
        names += [name, name]
        args += ["H", f"m:{slot}", ascii_json(member)]
        args += ["H", f"d:{slot}", ascii_json([coords, record.digest])]
    elif isinstance(record, VerdictRecord):
        cohort = record.cohort
        if record.scope is not None and record.scope != cohort.group_scope:
            raise ValueError(f"a verdict's scope {record.scope!r} is not its cohort's group scope")
        names += [keys.verdicts(cohort), keys.reuse(cohort)]
        args += [
            "V",
            f"{record.response_i}:{record.response_j}:{record.judge_index}",
            _verdict_json(record),
            _verdict_question(record) or "",
            key_text(cohort),
            _reuse_entry(record),
        ]
    elif isinstance(record, CohortRecord):
        header = [
            record.seq,
            record.group_size,
            _prompt_json(record.prompt),
            record.prompt_digest,
            record.phase.value,
            record.created_at,
            record.collection_deadline,
            record.evaluation_deadline,
            record.follows_attempt,
        ]
        names.append(keys.cohort(record.key))
        args += ["H", "h", ascii_json(header)]
    elif isinstance(record, DropCohort):
        names.append(keys.cohort(record.key))
        args.append("D")
        if not record.keep_verdicts:
            names += [keys.verdicts(record.key), keys.reuse(record.key)]
            args += ["X", key_text(record.key)]
    else:
        return False
    return True


def _retention_ops(
    record: Record,
    keys: Keys,
    max_tombstones: int,
    names: list[str],
    args: list[str | bytes | int],
) -> bool:
    """A tombstone or watermark's ops (written or dropped); False for other records."""
    if isinstance(record, TombstoneRecord):
        tomb = record.tombstone
        names += [keys.tombstone(tomb.key), keys.verdicts(tomb.key), keys.reuse(tomb.key)]
        names.append(keys.tombstone_index)
        value = EXPIRY.pack(record.expires_at) + tomb.record()
        now_ms = ms(time.time())
        args += ["T", value, ms(record.expires_at), max_tombstones, now_ms]
    elif isinstance(record, DropTombstone):
        names += [keys.tombstone(record.key), keys.tombstone_index]
        names += [keys.verdicts(record.key), keys.reuse(record.key)]
        args += ["U", "X", key_text(record.key)]
    elif isinstance(record, WatermarkRecord):
        text = f"{record.expires_at!r} {record.scope}".encode("utf-8", "surrogatepass")
        names += [keys.watermark(record.scope), keys.watermark_index]
        args += ["W", record.attempt, text, ms(record.expires_at)]
    elif isinstance(record, DropWatermark):
        names += [keys.watermark(record.scope), keys.watermark_index]
        args.append("U")
    else:
        return False
    return True


def index_ops(
    records: Sequence[Record],
    before: frozenset[CohortKey],
    keys: Keys,
    names: list[str],
    args: list[Any],
) -> None:
    """The replicas' deployment-wide indexes a group commit of ``records`` keeps, given
    the group's active cohorts ``before`` it: each active cohort's next deadline, and
    the active counts (a cohort created or dropped)."""
    created: set[CohortKey] = set()
    for record in records:
        if isinstance(record, CohortRecord):
            member = key_text(record.key)
            deadline = (
                record.evaluation_deadline
                if record.phase is Phase.EVALUATING and record.evaluation_deadline is not None
                else record.collection_deadline
            )
            names.append(keys.deadlines)
            args += ["Z", ms(deadline), member]
            if record.key not in before and record.key not in created:
                created.add(record.key)
                names += [keys.counts, keys.counts]
                args += ["I", "*", 1, "I", f"p:{record.key.principal}", 1]
        elif isinstance(record, DropCohort):
            member = key_text(record.key)
            names += [keys.deadlines, keys.evaluations, keys.lease(record.key)]
            args += ["R", member, "R", member, "D"]
            if record.key in before or record.key in created:
                names += [keys.counts, keys.counts]
                args += ["I", "*", -1, "I", f"p:{record.key.principal}", -1]


def decode_all(raw: dict[str, list[tuple[bytes, Any]]], now_wall: float) -> Recovered:
    """Turn the raw values into records (in a worker thread: it is CPU work)."""
    cohorts: list[RecoveredCohort] = []
    for name, fields in raw["c"]:
        if not fields or b"h" not in fields:
            continue  # members without a header are not a cohort
        cohorts.append(decode_cohort(key_from(name.split(b"}:", 1)[1]), fields))
    cohorts.sort(key=lambda c: c.header.seq)
    tombstones: list[TombstoneRecord] = []
    for _name, value in raw["t"]:
        if value is None:
            continue  # expired between SCAN and GET
        tomb = decode_tombstone(value)
        if tomb.expires_at > now_wall:
            tombstones.append(tomb)
    tombstones.sort(key=lambda t: t.expires_at)
    watermarks: list[WatermarkRecord] = []
    for _name, value in raw["w"]:
        if value is None:
            continue
        mark = decode_watermark(value)
        if mark.expires_at > now_wall:
            watermarks.append(mark)
    watermarks.sort(key=lambda w: w.expires_at)
    verdicts = tuple(
        verdict_from(value) for _name, fields in raw["v"] for value in (fields or {}).values()
    )
    return Recovered(tuple(cohorts), tuple(tombstones), tuple(watermarks), verdicts)


def decode_header(key: CohortKey, raw: bytes | str) -> CohortRecord:
    """A cohort hash's ``h`` field."""
    seq, size, prompt, digest, phase, created, collection, evaluation, *rest = json.loads(raw)
    return CohortRecord(
        key=key,
        seq=seq,
        group_size=size,
        prompt=decode_prompt(json.dumps(prompt)),
        prompt_digest=digest,
        phase=Phase(phase),
        created_at=created,
        collection_deadline=collection,
        evaluation_deadline=evaluation,
        follows_attempt=bool(rest[0]) if rest else False,
    )


def decode_tombstone(value: bytes) -> TombstoneRecord:
    """A ``genrm:t:`` value: its expiry, then the packed tombstone."""
    (expires,) = EXPIRY.unpack_from(value)
    return TombstoneRecord(Tombstone.from_record(value[EXPIRY.size :]), expires)


def decode_watermark(value: bytes) -> WatermarkRecord:
    attempt, expires, scope = value.decode("utf-8", "surrogatepass").split(" ", 2)
    return WatermarkRecord(scope, int(attempt), float(expires))


def decode_cohort(key: CohortKey, fields: dict[bytes, bytes]) -> RecoveredCohort:
    """An active cohort's hash (``h`` and the members' ``m:`` fields, texts included)."""
    members = []
    for name, value in fields.items():
        if name.startswith(b"m:"):
            coords, digest, reasoning, answer = json.loads(value)
            members.append(
                MemberRecord(key, MemberCoords(*coords), digest, AnswerTexts(reasoning, answer))
            )
    members.sort(key=lambda m: m.coords.rollout_index)
    return RecoveredCohort(decode_header(key, fields[b"h"]), tuple(members))


def digest_group(key: CohortKey, raw: Sequence[Any], now: float) -> Recovered:
    """The group a read returned: ``key``'s cohort and tombstone, the newest attempt's,
    and the watermark, as unexpired records."""
    _version, watermark, _total, _principal, fields, tomb, newest, newest_fields, newest_tomb = raw
    cohorts: list[RecoveredCohort] = []
    tombstones: list[TombstoneRecord] = []
    watermarks = []
    if watermark:
        mark_record = decode_watermark(watermark)
        if mark_record.expires_at > now:
            watermarks.append(mark_record)
    newest_key = None if not newest else CohortKey(key.group_id, None, int(newest), key.principal)
    for cohort_key, cohort_fields, tomb_value in (
        (key, fields, tomb),
        (newest_key, newest_fields, newest_tomb),
    ):
        if cohort_key is None:
            continue
        cohort = _digest_cohort(cohort_key, cohort_fields)
        if cohort is not None:
            cohorts.append(cohort)
        if tomb_value:
            record = decode_tombstone(tomb_value)
            if record.expires_at > now:
                tombstones.append(record)
    return Recovered(tuple(cohorts), tuple(tombstones), tuple(watermarks))


def _digest_cohort(key: CohortKey, flat: Sequence[bytes]) -> RecoveredCohort | None:
    """An active cohort from its ``h`` and ``d:`` fields (member texts left empty)."""
    fields = dict(zip(flat[0::2], flat[1::2], strict=True))
    raw = fields.get(b"h")
    if raw is None:
        return None
    # Every read returns all the members so far: one JSON parse for all of them, and
    # coordinates built from the parsed list (as decode_coords reads them).
    digested = json.loads(b"[" + b",".join(v for n, v in fields.items() if n[:2] == b"d:") + b"]")
    empty = AnswerTexts("", "")
    members = [
        MemberRecord(key, MemberCoords(*coords), digest, empty) for coords, digest in digested
    ]
    members.sort(key=lambda m: m.coords.rollout_index)
    return RecoveredCohort(decode_header(key, raw), tuple(members))
