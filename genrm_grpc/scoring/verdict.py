r"""Finding the judge's JSON verdict in free-form model output, in linear time.

Judges wrap the verdict in prose, reasoning and sometimes several draft objects. The
rules below pick the same object NeMo Gym's ``genrm_compare`` picks: a fenced
```` ```json ```` block wins over loose text (the first usable object inside the first
block that has one), otherwise the *last* usable object anywhere in the text, on the
theory that a judge's final answer comes last.

The answer is untrusted input that the parser reads on the server, so its cost must
not depend on how hostile the text is. The obvious implementations are not linear: the
fence regex ```` ```json\s*([\s\S]*?)\s*``` ```` backtracks cubically over an
unclosed fence followed by whitespace, and restarting the brace scan at every ``{``
that never closes is quadratic. Both are replaced here by scans that touch every
character a bounded number of times and return exactly what those definitions return
(``tests/scoring/test_verdict_equivalence.py`` checks that against the old code).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from typing import Any, Literal

from genrm_grpc.scoring.types import Verdict

__all__ = [
    "AttemptEnd",
    "AttemptsDecision",
    "after_failed_attempt",
    "find_json_objects",
    "parse_verdict",
]

_FENCE_OPEN = re.compile(r"```json", re.IGNORECASE)
_FENCE_CLOSE = "```"
_WHITESPACE = re.compile(r"\s*")
_SCAN_TOKENS = re.compile(r'\{+|[}"\\]')  # a run of "{" is one token
_VERDICT_KEYS = ("score_1", "score_2", "ranking")

# String states of the brace scan: outside a JSON string, inside one, or inside one
# right after a backslash (the next character is taken literally).
_OUT, _IN, _ESC = 0, 1, 2


class _Unparseable(Exception):
    """A candidate broke the parser itself (not merely invalid): the whole text fails."""


def fenced_blocks(text: str) -> list[str]:
    r"""The contents of the ```` ```json ```` fences of ``text``, in order.

    Exactly the ``group(1)`` values of ``re.finditer(r"```json\s*([\s\S]*?)\s*```",
    text, re.IGNORECASE)``, found in linear time: after an opening tag (matched
    case-insensitively, as the regex does) and the whitespace that follows it, a block
    runs to the first ```` ``` ```` and loses its trailing whitespace; the next search
    starts after that closing fence. An opening tag without a closing fence ends the
    search, since any later tag would itself contain a closing fence.
    """
    blocks: list[str] = []
    pos = 0
    while (opening := _FENCE_OPEN.search(text, pos)) is not None:
        spaces = _WHITESPACE.match(text, opening.end())
        body_start = opening.end() if spaces is None else spaces.end()  # \s* always matches
        closing = text.find(_FENCE_CLOSE, body_start)
        if closing == -1:
            break
        # \s and str.isspace() agree on every code point, so rstrip() drops exactly
        # what the regex's trailing \s* would; it cannot reach past body_start because
        # text[body_start] is not whitespace (or the block is empty).
        blocks.append(text[body_start:closing].rstrip())
        pos = closing + len(_FENCE_CLOSE)
    return blocks


class _Lane:
    """Brace scans that are in the same string state at the current position.

    Scans started at different ``{`` may disagree about what is inside a string (a
    ``{`` inside a string for one scan starts a scan of its own), but once two scans are
    in the same string state they read every later character the same way, and only
    their depths differ. A lane holds such scans as a stack of levels: the scans of
    level ``k`` from the top are at depth ``k + 1``, so one ``}`` closes the whole top
    level. Levels are linked lists (``head``/``tail`` into a shared ``after`` table) so
    that merging two lanes costs one step per level of the shorter stack, which the
    merge also removes, keeping the whole scan linear.
    """

    __slots__ = ("escape_at", "levels", "state")

    def __init__(self, state: int) -> None:
        self.state = state
        self.escape_at = -1
        self.levels: list[list[int]] = []  # [head, tail] of each level, bottom first


def _closing_braces(text: str) -> dict[int, int]:
    """For every ``{`` whose brace scan closes, the position of its closing ``}``.

    The scan from a ``{`` counts the braces outside JSON strings (a backslash inside a
    string escapes the next character) until its depth returns to zero. All scans are
    run at once, grouped in at most three lanes (one per string state), over the
    characters that can change a scan: braces, quotes and backslashes.
    """
    closing: dict[int, int] = {}
    after: dict[int, int] = {}  # next start in the same level
    lanes: list[_Lane] = []
    for match in _SCAN_TOKENS.finditer(text):
        pos = match.start()
        char = text[pos]
        changed = False
        if char == "{":
            for lane in lanes:
                if lane.state == _OUT:
                    break
            else:
                lanes.append(_Lane(_OUT))
            if _open_braces(lanes, pos, match.end()):
                lanes = _merged(lanes, after)
            continue
        for lane in lanes:
            state = lane.state
            if state == _OUT:
                if char == "}":
                    if lane.levels:
                        start, last = lane.levels.pop()
                        while True:
                            closing[start] = pos
                            if start == last:
                                break
                            start = after[start]
                        changed = changed or not lane.levels
                elif char == '"':
                    lane.state = _IN
                    changed = True
            elif state == _IN or lane.escape_at != pos - 1:
                # In a string (an escape whose escaped character was an ordinary one
                # is over by now).
                if char == '"':
                    lane.state = _OUT
                    changed = True
                elif char == "\\":
                    lane.state = _ESC
                    lane.escape_at = pos
                    changed = True
                elif state == _ESC:
                    lane.state = _IN
                    changed = True
            else:  # this character is the escaped one
                lane.state = _IN
                changed = True
        if changed:
            lanes = _merged(lanes, after)
    return closing


def _open_braces(lanes: list[_Lane], start: int, end: int) -> bool:
    """Apply the run of ``{`` at ``text[start:end]`` to every lane; True if a state changed."""
    changed = False
    for lane in lanes:
        if lane.state == _OUT:
            if end == start + 1:
                lane.levels.append([start, start])
            else:
                lane.levels.extend([pos, pos] for pos in range(start, end))
        elif lane.state == _ESC:
            lane.state = _IN  # the first brace is escaped, or the escape is already over
            changed = True
    return changed


def _merged(lanes: list[_Lane], after: dict[int, int]) -> list[_Lane]:
    """Join lanes in the same string state, aligning their stacks at the top."""
    if len(lanes) == 1:
        return lanes if lanes[0].levels else []
    by_state: dict[int, _Lane] = {}
    for lane in lanes:
        if not lane.levels:
            continue  # every scan of the lane has closed
        kept = by_state.get(lane.state)
        if kept is None:
            by_state[lane.state] = lane
            continue
        longer, shorter = (kept, lane) if len(kept.levels) >= len(lane.levels) else (lane, kept)
        for depth in range(1, len(shorter.levels) + 1):
            level, joined = longer.levels[-depth], shorter.levels[-depth]
            after[level[1]] = joined[0]
            level[1] = joined[1]
        by_state[lane.state] = longer
    return list(by_state.values())


def find_json_objects(text: str) -> list[str]:
    """Top-level ``{...}`` substrings of ``text``, found by brace counting.

    From each ``{`` the scan counts braces that lie outside JSON strings (a backslash
    inside a string escapes the next character) until the depth returns to zero; the
    substring is a candidate and scanning resumes right after it. A ``{`` that never
    closes is dropped and scanning resumes at the following character, so objects nested
    inside an unterminated one are still found. Linear in ``len(text)``: the closing
    brace of every scan is computed in one pass (:func:`_closing_braces`).
    """
    closing = _closing_braces(text)
    found: list[str] = []
    start = text.find("{")
    while start != -1:
        end = closing.get(start)
        if end is None:
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
        for block in fenced_blocks(text):
            if block[:1] == "{" and block[-1:] == "}":
                # The usual answer: the block is one object. When it decodes, the brace
                # scan would find exactly this string as the block's first candidate
                # (in valid JSON the braces outside strings first balance at its end),
                # so trying it first and scanning only when it is not a usable verdict
                # picks the same verdict without the scan. Anything else (not JSON, not a
                # verdict, a decoder crash) is left to the scan, which decides as before.
                with contextlib.suppress(_Unparseable):
                    verdict = _verdict_from_candidate(block, default_score, default_ranking)
                    if verdict is not None:
                        return verdict
            for candidate in find_json_objects(block):
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


# --------------------------------------------------------------------------------------
# What a comparison's failed attempts add up to
# --------------------------------------------------------------------------------------

AttemptEnd = Literal["unparseable", "unusable_answer", "no_answer"]
"""How one judge attempt ended without a verdict.

* ``unparseable`` — the judge completed a non-empty answer that holds no usable verdict
  (or one larger than ``judge.max_response_bytes``);
* ``unusable_answer`` — the judge answered (HTTP 2xx) but not with a completed,
  non-empty answer: empty text, or incomplete (output budget exhausted, any other
  unfinished status);
* ``no_answer`` — no answer came back: HTTP 408, 429 or 5xx, a connection failure, a
  reset or interrupted body, a body that is not JSON.

Final failures (an HTTP status other than 408/429/5xx, an expired per-request deadline)
end the comparison at once as a judge failure and never reach this decision.
"""

AttemptsDecision = Literal["retry", "default_verdict", "judge_failed"]


def after_failed_attempt(end: AttemptEnd, *, answered: bool, budget_left: bool) -> AttemptsDecision:
    """What happens after an attempt that gave no verdict: NeMo Gym's genrm_compare rule.

    ``answered``: some attempt of this comparison so far, this one included, ended
    ``unparseable``. ``budget_left``: the retry budget (``genrm_parse_retries``) allows
    another attempt.

    While budget is left, every such attempt is retried. When it is spent, the *last*
    attempt decides, with the earlier ones only counting through ``answered``:

    * it got no answer (``no_answer``) → ``judge_failed``, whatever came before it (an
      unparseable first answer followed by 503s is masked, as in Gym, whose transport
      and HTTP failures on the final attempt always raise its ``JudgeError``);
    * it got an answer (``unparseable`` or ``unusable_answer``) → ``default_verdict``
      if any attempt got a completed non-empty answer, else ``judge_failed``; the order
      of those answers does not matter (malformed then empty, or empty then malformed,
      both give the default verdict).
    """
    if budget_left:
        return "retry"
    if end == "no_answer" or not answered:
        return "judge_failed"
    return "default_verdict"
