"""Finding the judge's JSON verdict in free-form model output.

Judges wrap the verdict in prose, reasoning and sometimes several draft objects. The
rules below pick the same object NeMo Gym's ``genrm_compare`` picks: a fenced
```` ```json ```` block wins over loose text (the first usable object inside the first
block that has one), otherwise the *last* usable object anywhere in the text, on the
theory that a judge's final answer comes last.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from genrm_grpc.scoring.types import Verdict

__all__ = ["find_json_objects", "parse_verdict"]

_FENCED_JSON = re.compile(r"```json\s*([\s\S]*?)\s*```", re.IGNORECASE)
_VERDICT_KEYS = ("score_1", "score_2", "ranking")


class _Unparseable(Exception):
    """A candidate broke the parser itself (not merely invalid): the whole text fails."""


def find_json_objects(text: str) -> list[str]:
    """Top-level ``{...}`` substrings of ``text``, found by brace counting.

    From each ``{`` the scan counts braces that lie outside JSON strings (a backslash
    inside a string escapes the next character) until the depth returns to zero; the
    substring is a candidate and scanning resumes right after it. A ``{`` that never
    closes is dropped and scanning resumes at the following character, so objects nested
    inside an unterminated one are still found.
    """
    found: list[str] = []
    length = len(text)
    start = text.find("{")
    while start != -1:
        depth = 0
        in_string = False
        escaped = False
        end = -1
        for pos in range(start, length):
            ch = text[pos]
            if escaped:
                escaped = False
            elif in_string:
                if ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = pos
                    break
        if end == -1:
            start = text.find("{", start + 1)
        else:
            found.append(text[start : end + 1])
            start = text.find("{", end + 1)
    return found


def _to_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
    except OverflowError as exc:  # e.g. a 400-digit integer literal
        raise _Unparseable from exc


def _verdict_from_candidate(
    candidate: str, default_score: float, default_ranking: float
) -> Verdict | None:
    try:
        parsed = json.loads(candidate)
    except json.JSONDecodeError:
        return None
    except Exception as exc:  # RecursionError, int digit limit, ...
        raise _Unparseable from exc
    if not isinstance(parsed, dict):
        return None
    overall = parsed.get("overall")
    if isinstance(overall, dict):
        parsed = overall
    if not any(key in parsed for key in _VERDICT_KEYS):
        return None
    score_1 = _to_float(parsed.get("score_1", default_score))
    score_2 = _to_float(parsed.get("score_2", default_score))
    ranking = _to_float(parsed.get("ranking", default_ranking))
    if score_1 is None or score_2 is None or ranking is None:
        return None
    if not (math.isfinite(score_1) and math.isfinite(score_2) and math.isfinite(ranking)):
        return None
    return Verdict(score_1, score_2, ranking)


def parse_verdict(
    text: str, *, default_score: float = 3.0, default_ranking: float = 3.5
) -> Verdict | None:
    """The verdict in ``text``, or ``None`` when no usable object exists.

    A candidate is usable when it decodes to a JSON object; when that object has a dict
    under ``"overall"`` (the rubric format) the nested dict is used instead; it must
    carry at least one of ``score_1``, ``score_2``, ``ranking``; absent keys take
    ``default_score`` / ``default_ranking``; every value must go through Python's
    ``float()`` (so numeric strings and booleans are accepted, ``null`` and containers
    are not) and come out finite.

    Search order: each fenced ```` ```json ```` block in turn (case-insensitive), taking
    the first usable object inside it; failing that, the last usable object in the whole
    text. A candidate that crashes the decoder rather than being merely malformed (too
    deep, an integer too long or too large for a float) fails the whole text, as it does
    in the reference. The caller decides what a failure means (retry, or fall back to
    the defaults and count a parse failure).
    """
    try:
        for block in _FENCED_JSON.finditer(text):
            for candidate in find_json_objects(block.group(1)):
                verdict = _verdict_from_candidate(candidate, default_score, default_ranking)
                if verdict is not None:
                    return verdict
        last: Verdict | None = None
        for candidate in find_json_objects(text):
            verdict = _verdict_from_candidate(candidate, default_score, default_ranking)
            if verdict is not None:
                last = verdict
        return last
    except _Unparseable:
        return None
