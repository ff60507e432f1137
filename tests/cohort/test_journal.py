"""The verdict journal's index: resume the same pass, reuse within a group only."""

from __future__ import annotations

from genrm_grpc.cohort.journal import VerdictJournal, judge_context
from genrm_grpc.cohort.model import CohortKey
from genrm_grpc.cohort.records import VerdictRecord
from genrm_grpc.scoring.types import Verdict

A1 = CohortKey("g", None, 1)
A2 = CohortKey("g", None, 2)
LEGACY = CohortKey(None, "t1:abc", 0)
CTX = judge_context("prompt", {"model": "genrm", "temperature": 0.6})


def record(
    cohort: CohortKey, i: int, j: int, first: str, second: str, **kw: object
) -> VerdictRecord:
    fields: dict[str, object] = {
        "cohort": cohort,
        "scope": cohort.group_id,
        "context": CTX,
        "first": first,
        "second": second,
        "judge_index": 0,
        "swap": False,
        "response_i": i,
        "response_j": j,
        "verdict": Verdict(4.0, 2.0, 2.0),
        "usage": None,
        "finished_at": 0.0,
    }
    fields.update(kw)
    return VerdictRecord(**fields)  # type: ignore[arg-type]


def test_a_finished_pass_resumes_in_its_own_cohort_only() -> None:
    journal = VerdictJournal()
    journal.add(record(A1, 0, 1, "a", "b"))
    assert journal.resume(A1, 0, 1, 0) is not None
    assert journal.resume(A1, 1, 0, 0) is None
    assert journal.resume(A1, 0, 1, 1) is None
    assert journal.resume(A2, 0, 1, 0) is None


def test_identical_answers_in_a_later_attempt_reuse_the_verdict_in_any_slots() -> None:
    journal = VerdictJournal()
    journal.add(record(A1, 0, 1, "a", "b"))
    found = journal.reusable("g", CTX, "a", "b", 0, False)
    assert found is not None and found.cohort == A1


def test_reuse_needs_the_same_order_context_judge_index_and_swap() -> None:
    journal = VerdictJournal()
    journal.add(record(A1, 0, 1, "a", "b"))
    other_ctx = judge_context("prompt", {"model": "genrm", "temperature": 0.7})
    assert journal.reusable("g", CTX, "b", "a", 0, False) is None
    assert journal.reusable("g", other_ctx, "a", "b", 0, False) is None
    assert journal.reusable("g", CTX, "a", "b", 1, False) is None
    assert journal.reusable("g", CTX, "a", "b", 0, True) is None
    assert journal.reusable("other-group", CTX, "a", "b", 0, False) is None


def test_legacy_verdicts_and_disabled_reuse_never_serve_another_cohort() -> None:
    journal = VerdictJournal()
    journal.add(record(LEGACY, 0, 1, "a", "b", scope=None))
    assert journal.resume(LEGACY, 0, 1, 0) is not None
    assert journal.reusable(None, CTX, "a", "b", 0, False) is None
    off = VerdictJournal(reuse=False)
    off.add(record(A1, 0, 1, "a", "b"))
    assert off.reusable("g", CTX, "a", "b", 0, False) is None
    assert off.resume(A1, 0, 1, 0) is not None


def test_dropping_one_attempt_keeps_the_same_verdict_of_another() -> None:
    journal = VerdictJournal()
    journal.add(record(A1, 0, 1, "a", "b"))
    journal.add(record(A2, 3, 4, "a", "b"))
    assert journal.drop(A1) == 1
    found = journal.reusable("g", CTX, "a", "b", 0, False)
    assert found is not None and found.cohort == A2
    assert journal.drop(A2) == 1
    assert journal.reusable("g", CTX, "a", "b", 0, False) is None
    assert len(journal) == 0


def test_the_context_digest_depends_on_prompt_and_every_setting() -> None:
    base = judge_context("p", {"model": "m", "max_output_tokens": 100})
    assert base == judge_context("p", {"max_output_tokens": 100, "model": "m"})
    assert base != judge_context("q", {"model": "m", "max_output_tokens": 100})
    assert base != judge_context("p", {"model": "m", "max_output_tokens": 200})
