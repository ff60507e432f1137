"""What a comparison's attempts add up to, for every mix of per-attempt outcomes.

One row per sequence of attempt outcomes, served by the fake judge over real loopback
HTTP (each attempt gets exactly the fault its row names: the fault is switched before
every retry, in the injected ``sleep``). The budget is the row's length, so the last
listed attempt is the last one the budget allows. The expectations are NeMo Gym's
genrm_compare rule (cohort-lifecycle revision, ``_run_single_comparison``), stated in
docs/protocol.md "When the judge fails":

* a verdict ends the comparison;
* HTTP 400 and an expired request deadline end it at once, masked;
* with the budget spent, a last attempt that got no answer (503, 429, reset, interrupted
  or non-JSON body) is masked whatever came before; a last attempt that got an answer
  without a verdict (unparseable, empty, budget-exhausted) gives the default verdict
  if any attempt got a completed non-empty answer, else masked.
"""

from __future__ import annotations

from typing import Any

import pytest

from genrm_grpc.judge.client import JudgeClient, JudgeFailedError
from genrm_grpc.testing import FakeJudgeConfig, FakeJudgeServer
from genrm_grpc.testing.faults import FAULT_KINDS
from tests.judge.test_client import (
    ANSWER_A,
    ANSWER_B,
    DEFAULT_VERDICT,
    INPUT,
    SleepRecorder,
    config_for,
    expected_verdict,
)

# Row vocabulary → the fake judge's fault kind ("ok": a parseable verdict).
FAULTS = {
    "unparseable": "malformed",
    "empty": "empty",
    "budget": "budget_exhaust",
    "503": "fail_503",
    "429": "fail_429",
    "reset": "reset",
    "truncated": "truncate",
    "not_json": "invalid_json",
    "400": "fail_400",
    "timeout": "hang",
    "ok": None,
}

# (attempt outcomes in order, expected result, attempts made)
TABLE: list[tuple[str, str, int]] = [
    # one attempt
    ("ok", "verdict", 1),
    ("unparseable", "default", 1),
    ("empty", "masked", 1),
    ("budget", "masked", 1),
    ("503", "masked", 1),
    ("429", "masked", 1),
    ("reset", "masked", 1),
    ("truncated", "masked", 1),
    ("not_json", "masked", 1),
    # a later success always wins
    ("unparseable ok", "verdict", 2),
    ("empty ok", "verdict", 2),
    ("budget ok", "verdict", 2),
    ("503 ok", "verdict", 2),
    ("429 ok", "verdict", 2),
    ("reset ok", "verdict", 2),
    ("truncated ok", "verdict", 2),
    ("not_json ok", "verdict", 2),
    # an unparseable answer, then answers without a verdict: default, in any order
    ("unparseable unparseable", "default", 2),
    ("unparseable empty", "default", 2),
    ("empty unparseable", "default", 2),
    ("unparseable budget", "default", 2),
    ("budget unparseable", "default", 2),
    ("unparseable budget budget", "default", 3),
    ("budget budget unparseable", "default", 3),
    ("empty budget unparseable", "default", 3),
    # an unparseable answer, then no answer on the last attempt: masked (Gym #3351)
    ("unparseable 503", "masked", 2),
    ("unparseable 503 503", "masked", 3),
    ("unparseable 429", "masked", 2),
    ("unparseable reset", "masked", 2),
    ("unparseable truncated", "masked", 2),
    ("unparseable not_json", "masked", 2),
    ("unparseable empty 503", "masked", 3),
    # no answer earlier, an answer last: the answers decide
    ("503 unparseable", "default", 2),
    ("reset 429 unparseable", "default", 3),
    ("503 empty", "masked", 2),
    ("429 budget", "masked", 2),
    ("unparseable 503 empty", "default", 3),
    ("unparseable reset budget", "default", 3),
    # never a completed non-empty answer: masked
    ("empty empty", "masked", 2),
    ("empty budget", "masked", 2),
    ("budget empty", "masked", 2),
    ("503 503", "masked", 2),
    ("reset 503 429", "masked", 3),
    ("budget 503 empty", "masked", 3),
    # final failures end the comparison at once, whatever came before
    ("400", "masked", 1),
    ("unparseable 400 ok", "masked", 2),
    ("timeout", "masked", 1),
    ("unparseable timeout ok", "masked", 2),
]


def _faults_for(outcome: str) -> dict[str, Any]:
    kind = FAULTS[outcome]
    return {f"{name}_rate": 1.0 if name == kind else 0.0 for name in FAULT_KINDS}


@pytest.mark.parametrize(("outcomes", "expected", "attempts"), TABLE, ids=[r[0] for r in TABLE])
async def test_the_last_attempt_and_any_completed_answer_decide_verdict_default_or_mask(
    outcomes: str, expected: str, attempts: int
) -> None:
    sequence = outcomes.split()
    config = FakeJudgeConfig(retry_after_s=None, **_faults_for(sequence[0]))
    timeout = 0.3 if "timeout" in sequence else 10.0
    with FakeJudgeServer(config) as fake:

        def before_retry(retries_so_far: int) -> None:
            fake.set_faults(**_faults_for(sequence[retries_so_far]))

        settings = config_for(
            fake, genrm_parse_retries=len(sequence) - 1, judge_request_timeout_s=timeout
        )
        async with JudgeClient(settings, sleep=SleepRecorder(before_retry)) as client:
            try:
                outcome = await client.judge(INPUT)
            except JudgeFailedError:
                result, made = "masked", fake.stats()["total"]
            else:
                made = outcome.attempts
                if outcome.verdict == DEFAULT_VERDICT:
                    result = "default"
                else:
                    assert outcome.verdict == expected_verdict(ANSWER_A, ANSWER_B)
                    result = "verdict"
        stats = fake.stats()

    assert (result, made) == (expected, attempts)
    served = [FAULTS[o] or "ok" for o in sequence[:attempts]]
    assert stats["by_outcome"] == {kind: served.count(kind) for kind in served}
