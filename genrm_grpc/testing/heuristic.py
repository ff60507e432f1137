"""The fake judge's verdict heuristic (a test double, not a model).

Deterministic: the same request always gets the same verdict. Words are runs of
``[a-z0-9]`` in the lower-cased text. For each answer:

* a blank answer or the literal ``None`` (GenRM's placeholder for an empty answer)
  scores 1, the lowest score;
* otherwise ``overlap`` = the share of distinct words of the last user turn that the
  answer also uses, ``length`` = min(word count, 60) / 60, and the score is
  ``2 + min(3, floor(4 * (overlap + length) / 2))``, i.e. 2..5.

The ranking (1 = response 1 much better ... 6 = response 2 much better) comes from
``d = score_1 - score_2``: d ≥ 2 → 1, d = 1 → 2, d = 0 → 3 or 4, d = -1 → 5, d ≤ -2 → 6.
A tie is broken by the parity of the first byte of ``sha256(response_1 + "\\0" +
response_2)``, so it is stable for a pair but may differ when the pair is swapped (a
little position bias, as real judges have). The principle is accepted and ignored.
The answer is short prose followed by a fenced ```` ```json ```` block
``{"score_1": s1, "score_2": s2, "ranking": r}``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

_WORD = re.compile(r"[a-z0-9]+")
_LENGTH_SATURATION_WORDS = 60


def pair_key(response_1: str, response_2: str) -> str:
    """The fake judge's counter key for an ordered answer pair."""
    digest = hashlib.sha256((response_1 + "\x00" + response_2).encode("utf-8"))
    return digest.hexdigest()[:16]


def words(text: str) -> list[str]:
    """The words of ``text`` (runs of ``[a-z0-9]`` after lower-casing)."""
    return _WORD.findall(text.lower())


def fake_score(last_user_turn: str, answer: str) -> int:
    """The fake judge's 1..5 score for one answer (see the module docstring)."""
    stripped = answer.strip()
    if not stripped or stripped == "None":
        return 1
    answer_words = words(answer)
    prompt_words = set(words(last_user_turn))
    overlap = len(prompt_words & set(answer_words)) / len(prompt_words) if prompt_words else 0.0
    length = min(len(answer_words), _LENGTH_SATURATION_WORDS) / _LENGTH_SATURATION_WORDS
    return 2 + min(3, math.floor(4 * (overlap + length) / 2))


def fake_verdict(last_user_turn: str, response_1: str, response_2: str) -> tuple[int, int, int]:
    """The fake judge's ``(score_1, score_2, ranking)`` for an ordered pair."""
    score_1 = fake_score(last_user_turn, response_1)
    score_2 = fake_score(last_user_turn, response_2)
    diff = score_1 - score_2
    if diff >= 2:
        ranking = 1
    elif diff == 1:
        ranking = 2
    elif diff == 0:
        first_byte = hashlib.sha256((response_1 + "\x00" + response_2).encode("utf-8")).digest()[0]
        ranking = 3 if first_byte % 2 == 0 else 4
    elif diff == -1:
        ranking = 5
    else:
        ranking = 6
    return score_1, score_2, ranking


def verdict_text(last_user_turn: str, response_1: str, response_2: str) -> str:
    """The fake judge's full answer text: prose, then a fenced JSON verdict."""
    score_1, score_2, ranking = fake_verdict(last_user_turn, response_1, response_2)
    verdict = json.dumps({"score_1": score_1, "score_2": score_2, "ranking": ranking})
    return (
        "Fake judge (a deterministic test double, not a model). "
        f"Response 1 has {len(words(response_1))} words and response 2 has "
        f"{len(words(response_2))}; scores come from word overlap with the last user "
        "turn plus a length term.\n"
        f"```json\n{verdict}\n```"
    )


REASONING_SUMMARY = (
    "Heuristic: share of the last user turn's words reused by each answer, plus a "
    "length term, bucketed into scores 1 to 5."
)
