"""The pair-verdict journal's index: which judge passes need no judge call.

Every finished judge pass is journaled (a :class:`VerdictRecord`, written through the
store the moment it finishes). Before a pass is judged, the runtime asks this index:

- **resume** — the same pass of the same cohort (cohort key, pair, judge index) already
  finished, e.g. before a restart: its verdict is the pass's verdict;
- **reuse** — a pass of another attempt of the same group compared byte-identical
  answers in the same order, under the same prompt and judge settings (the ``context``
  digest), with the same judge index and side swap: its verdict is taken instead of a
  new call. Only records with a ``scope`` (explicit group ids) take part; legacy cohorts
  are journaled without one, so an identical legacy rerun is judged again.

Sans-IO and O(1) per lookup; memory is proportional to the journaled passes of the
cohorts whose tombstones are retained, and :meth:`drop` forgets a cohort's passes when
retention drops it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from genrm_grpc.cohort.model import CohortKey
from genrm_grpc.cohort.records import VerdictRecord

_PassKey = tuple[CohortKey, int, int, int]
_ContentKey = tuple[str, str, str, str, int, bool]


def judge_context(prompt_digest: str, settings: Mapping[str, object]) -> str:
    """A digest of everything besides the two answers that can change a verdict.

    ``settings`` names the judge (URL path, API, model), its sampling parameters and
    output budget, and the principle actually sent; two passes with equal contexts and
    equal answers ask the judge the same question.
    """
    body = json.dumps(
        {"prompt": prompt_digest, "judge": dict(settings)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()


class VerdictJournal:
    """Journaled verdicts by pass (resume) and by content within a group (reuse)."""

    def __init__(self, *, reuse: bool = True) -> None:
        self.reuse_enabled = reuse
        self._by_pass: dict[_PassKey, VerdictRecord] = {}
        # Several attempts may have judged the same question; any of them serves, and
        # the others keep serving when retention drops one.
        self._by_content: dict[_ContentKey, list[VerdictRecord]] = {}
        self._by_cohort: dict[CohortKey, list[VerdictRecord]] = {}

    def __len__(self) -> int:
        return len(self._by_pass)

    def add(self, record: VerdictRecord) -> None:
        pass_key = (record.cohort, record.response_i, record.response_j, record.judge_index)
        if pass_key in self._by_pass:
            return
        self._by_pass[pass_key] = record
        self._by_cohort.setdefault(record.cohort, []).append(record)
        content = _content_key(record)
        if content is not None:
            self._by_content.setdefault(content, []).append(record)

    def extend(self, records: Iterable[VerdictRecord]) -> None:
        for record in records:
            self.add(record)

    def of_cohort(self, cohort: CohortKey) -> list[VerdictRecord]:
        """Every pass journaled for ``cohort`` (an evaluation read back to resume)."""
        return list(self._by_cohort.get(cohort, ()))

    def resume(self, cohort: CohortKey, i: int, j: int, judge_index: int) -> VerdictRecord | None:
        """The verdict this very pass already got (a restart interrupted its cohort)."""
        return self._by_pass.get((cohort, i, j, judge_index))

    def reusable(
        self,
        scope: str | None,
        context: str,
        first: str,
        second: str,
        judge_index: int,
        swap: bool,
    ) -> VerdictRecord | None:
        """A verdict on the same question from another attempt of the group, if any."""
        if not self.reuse_enabled or scope is None:
            return None
        found = self._by_content.get((scope, context, first, second, judge_index, swap))
        return found[0] if found else None

    def drop(self, cohort: CohortKey) -> int:
        """Forget every pass journaled for ``cohort``; returns how many went."""
        records = self._by_cohort.pop(cohort, ())
        for record in records:
            self._by_pass.pop(
                (record.cohort, record.response_i, record.response_j, record.judge_index), None
            )
            content = _content_key(record)
            if content is None:
                continue
            same = self._by_content.get(content, [])
            same[:] = [r for r in same if r is not record]
            if not same:
                self._by_content.pop(content, None)
        return len(records)


def _content_key(record: VerdictRecord) -> _ContentKey | None:
    if record.scope is None:
        return None
    return (
        record.scope,
        record.context,
        record.first,
        record.second,
        record.judge_index,
        record.swap,
    )
