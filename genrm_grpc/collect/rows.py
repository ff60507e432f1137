"""Reading NeMo Gym rollout rows and forming them into groups (pure, no I/O beyond reading).

A row is one JSON object per line: ``responses_create_params.input`` (a string, or a
list of messages whose ``content`` is a string or a list of content parts), ``response``
(a Responses-API object), optional ``principle`` and the coordinates ``_ng_group_id``,
``_ng_group_attempt``, ``_ng_rollout_index``, ``_ng_task_index`` (and, as an extension,
``_ng_group_size``).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BadRow", "Group", "Row", "form_groups", "parse_lines", "parse_row"]

_TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})


@dataclass(frozen=True)
class BadRow:
    """A line that is not a usable rollout row."""

    line: int
    reason: str
    raw: str


@dataclass
class Row:
    line: int
    data: dict[str, Any]
    messages: tuple[tuple[str, str], ...]
    principle: str | None
    response: dict[str, Any]
    group_id: str | None
    attempt: int | None
    rollout_index: int | None
    task_index: int | None
    group_size: int | None

    @property
    def prompt_digest(self) -> str:
        return prompt_digest(self.messages, self.principle)


@dataclass
class Group:
    """The rows of one group attempt as found in the file, and what is wrong with it."""

    key: str
    explicit_id: str | None
    file_attempt: int
    task_index: int | None
    messages: tuple[tuple[str, str], ...]
    principle: str | None
    size: int
    rows: list[Row] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    problem: tuple[str, str] | None = None
    """``(failure_class, reason)`` when the group cannot be submitted."""


def prompt_digest(messages: Iterable[tuple[str, str]], principle: str | None) -> str:
    blob = json.dumps([list(messages), principle], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class _Bad(Exception):
    pass


def _content_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                if part.get("type", "text") in _TEXT_PART_TYPES:
                    texts.append(part["text"])
            else:
                raise _Bad(f"{where}: content parts must be objects with a 'text'")
        return "".join(texts)
    raise _Bad(f"{where}: content must be a string or a list of content parts")


def _messages(params: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(params, dict):
        raise _Bad("'responses_create_params' must be an object")
    raw = params.get("input")
    turns: list[tuple[str, str]] = []
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        turns.append(("system", instructions))
    if isinstance(raw, str):
        turns.append(("user", raw))
    elif isinstance(raw, list):
        for n, item in enumerate(raw):
            where = f"responses_create_params.input[{n}]"
            if not isinstance(item, dict):
                raise _Bad(f"{where} must be an object")
            if item.get("type", "message") != "message":
                continue  # tool calls and their outputs are not part of the judged prompt
            role = item.get("role")
            if not isinstance(role, str) or not role:
                raise _Bad(f"{where}: 'role' must be a non-empty string")
            turns.append((role, _content_text(item.get("content"), where)))
    else:
        raise _Bad("'responses_create_params.input' must be a string or a list of messages")
    if not any(role != "system" for role, _ in turns):
        raise _Bad("'responses_create_params.input' holds no conversation turn")
    return tuple(turns)


def _opt_int(row: dict[str, Any], name: str, minimum: int | None) -> int | None:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"'{name}' must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise _Bad(f"'{name}' must be >= {minimum}, got {value}")
    return value


def parse_row(line: int, text: str) -> Row:
    """Parse one line; raises ``ValueError`` with a human-readable reason."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError("a row must be a JSON object")
    try:
        messages = _messages(data.get("responses_create_params"))
        response = data.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            raise _Bad("'response' must be a Responses-API object with an 'output' list")
        principle = data.get("principle")
        if principle is not None and not isinstance(principle, str):
            raise _Bad("'principle' must be a string")
        group_id = data.get("_ng_group_id")
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise _Bad("'_ng_group_id' must be a non-empty string")
        return Row(
            line=line,
            data=data,
            messages=messages,
            principle=principle,
            response=response,
            group_id=group_id,
            attempt=_opt_int(data, "_ng_group_attempt", 0),
            rollout_index=_opt_int(data, "_ng_rollout_index", 0),
            task_index=_opt_int(data, "_ng_task_index", None),
            group_size=_opt_int(data, "_ng_group_size", 1),
        )
    except _Bad as exc:
        raise ValueError(str(exc)) from None


def parse_lines(lines: Iterable[str]) -> tuple[list[Row], list[BadRow], int]:
    """All rows and bad rows of a file (blank lines are ignored); also the row count."""
    rows: list[Row] = []
    bad: list[BadRow] = []
    count = 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        count += 1
        try:
            rows.append(parse_row(number, text))
        except ValueError as exc:
            bad.append(BadRow(number, str(exc), text.rstrip("\n")[:2000]))
    return rows, bad, count


def _group_key(row: Row) -> str:
    if row.group_id is not None:
        return f"id:{row.group_id}"
    digest = row.prompt_digest[:16]
    if row.task_index is not None:
        return f"task:{row.task_index}:{digest}"
    return f"prompt:{digest}"


def form_groups(rows: list[Row], group_size: int | None) -> tuple[list[Group], list[BadRow]]:
    """Group rows (explicit id, else task index + prompt digest, else prompt digest).

    The group size is ``group_size`` when given, else the rows' ``_ng_group_size``, else
    the largest ``_ng_rollout_index`` + 1 in the whole file (Gym samples the same number
    of rollouts per task in one run). Rows of an older attempt of an explicit group that
    also appears with a newer attempt are returned as bad rows. Groups are returned in
    the order of their first row.
    """
    by_key: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_key[_group_key(row)].append(row)
    bad = _drop_superseded(by_key)
    # Rollout indices: given, or the order of appearance in groups where none is given.
    indices: dict[str, list[int | None]] = {}
    file_max = 0
    for key, members in by_key.items():
        given = [r.rollout_index for r in members]
        if all(i is None for i in given):
            given = list(range(len(members)))
        indices[key] = given
        file_max = max([file_max, *((i or 0) + 1 for i in given if i is not None)])
    groups = [
        _form_group(key, members, indices[key], group_size, file_max)
        for key, members in by_key.items()
    ]
    return groups, bad


def _drop_superseded(by_key: dict[str, list[Row]]) -> list[BadRow]:
    """Keep only the newest attempt of each explicit group; the older rows, as bad rows."""
    bad: list[BadRow] = []
    for key, members in by_key.items():
        attempts = {r.attempt or 0 for r in members}
        if key.startswith("id:") and len(attempts) > 1:
            newest = max(attempts)
            for r in members:
                if (r.attempt or 0) != newest:
                    reason = f"superseded by attempt {newest} of the same group in this file"
                    bad.append(BadRow(r.line, reason, json.dumps(r.data)[:2000]))
            by_key[key] = [r for r in members if (r.attempt or 0) == newest]
    return bad


def _form_group(
    key: str,
    members: list[Row],
    indices: list[int | None],
    group_size: int | None,
    file_max: int,
) -> Group:
    """One group of rows in rollout-index order, with its problem if it has one."""
    first = members[0]
    sizes = {r.group_size for r in members if r.group_size is not None}
    size = group_size or (max(sizes) if sizes else file_max)
    group = Group(
        key=key,
        explicit_id=first.group_id,
        file_attempt=first.attempt or 0,
        task_index=first.task_index,
        messages=first.messages,
        principle=first.principle,
        size=size,
    )
    slot_lines: dict[int, int] = {}
    problems: list[str] = []
    if len(sizes) > 1:
        problems.append(f"rows disagree on _ng_group_size: {sorted(sizes)}")
    for row, index in zip(members, indices, strict=True):
        if index is None:
            problems.append(f"line {row.line} has no _ng_rollout_index, its siblings do")
            continue
        if index >= size:
            problems.append(f"line {row.line}: rollout index {index} >= group size {size}")
        elif index in slot_lines:
            problems.append(
                f"rollout index {index} appears on lines {slot_lines[index]} and {row.line}"
            )
        if row.prompt_digest != first.prompt_digest:
            problems.append(f"line {row.line}: prompt/principle differs from line {first.line}")
        slot_lines.setdefault(index, row.line)
        group.rows.append(row)
        group.indices.append(index)
    order = sorted(range(len(group.rows)), key=lambda k: group.indices[k])
    group.rows = [group.rows[k] for k in order]
    group.indices = [group.indices[k] for k in order]
    if problems:
        group.problem = ("invalid", "; ".join(problems)[:2000])
    elif len(slot_lines) < size:
        missing = sorted(set(range(size)) - set(slot_lines))
        shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
        group.problem = (
            "incomplete_group",
            f"the file holds {len(slot_lines)} of {size} members; missing rollout "
            f"indices [{shown}] (a partial group can never be rewarded)",
        )
    return group
