"""genrm-grpc collect in process against a real server (loopback gRPC) and the fake judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from genrm_grpc.collect import main_async
from genrm_grpc.collect.rows import form_groups, parse_lines
from genrm_grpc.judge.fake import FakeJudgeServer, pair_key
from tests.client.support import cohort_server, gym_rows, judged_text, prewarm_pairs

GOOD_A = ["Seven is a prime number.", "Four.", "Two is the only even prime number.", "Nine."]
GOOD_B = ["Paris is the capital of France.", "Paris.", "Lyon.", "France has no capital."]
OUTAGE = ["Eleven is prime.", "Six.", "Thirteen is a prime number.", "One."]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mixed_file(tmp_path: Path) -> Path:
    rows: list[Any] = [
        *gym_rows("Name a prime number.", GOOD_A, task_index=0),
        *gym_rows("What is the capital of France?", GOOD_B, group_id="explicit-b", attempt=0),
        *gym_rows("Name another prime number.", OUTAGE, task_index=2),
        # Missing rollout index 2 of 4: can never complete.
        *[
            r
            for r in gym_rows(
                "Name an odd number.", ["Three.", "Five.", "Seven.", "Nine."], task_index=3
            )
            if r["_ng_rollout_index"] != 2
        ],
        "{not json",
    ]
    return write_jsonl(tmp_path / "rollouts.jsonl", rows)


def pair_texts(answers: list[str]) -> list[str]:
    return [judged_text(gym_rows("p", [a])[0]["response"]) for a in answers]


async def test_collect_writes_usable_rewards_failures_with_class_and_metrics(
    fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    source = mixed_file(tmp_path)
    fake_judge.set_faults(fail_400_first_n=1)  # every pair's first judge request fails…
    prewarm_pairs(fake_judge, pair_texts(GOOD_A))  # …except the good groups', used up here
    prewarm_pairs(fake_judge, pair_texts(GOOD_B))
    warm = fake_judge.stats()["total"]
    out = tmp_path / "results.jsonl"
    async with cohort_server(fake_judge.url) as port:
        code = await main_async(
            [
                "--server",
                f"127.0.0.1:{port}",
                "--input",
                str(source),
                "--output",
                str(out),
                "--no-progress",
            ]
        )
    assert code == 0
    results = read_jsonl(out)
    assert len(results) == 8
    assert {r["_ng_group_id"] for r in results if r.get("_ng_task_index") == 0} != {None}
    assert {r["_ng_group_id"] for r in results} >= {"explicit-b"}
    assert all(isinstance(r["reward"], float) and "_ng_failure_class" not in r for r in results)
    assert all(r["_ng_group_attempt"] == 0 and r["_ng_group_size"] == 4 for r in results)
    assert all(len(r["comparisons"]) == 2 and "reward_overall_score" in r for r in results)
    answers = sorted(r["response"]["output"][-1]["content"][0]["text"] for r in results)
    assert answers == sorted(GOOD_A + GOOD_B)

    failures = read_jsonl(tmp_path / "results.failures.jsonl")
    by_class: dict[str, list[dict[str, Any]]] = {}
    for rec in failures:
        by_class.setdefault(rec["_ng_failure_class"], []).append(rec)
    assert sorted(by_class) == ["bad_row", "incomplete_group", "judge_failed"]
    masked = by_class["judge_failed"]
    assert len(masked) == 4 and all(r["mask_sample"] and "reward" not in r for r in masked)
    assert sorted(r["response"]["output"][-1]["content"][0]["text"] for r in masked) == sorted(
        OUTAGE
    )
    assert all(r["_ng_failure_reason"] for r in masked)
    incomplete = by_class["incomplete_group"]
    assert (
        len(incomplete) == 3
        and "missing rollout indices [2]" in incomplete[0]["_ng_failure_reason"]
    )
    assert [r["_ng_line"] for r in by_class["bad_row"]] == [16]

    metrics = json.loads((tmp_path / "results.metrics.json").read_text())
    rewards = [r["reward"] for r in results]
    assert metrics["usable_rewards"] == 8
    assert metrics["reward"]["count"] == 8
    assert abs(metrics["reward"]["mean"] - sum(rewards) / 8) < 1e-9
    assert metrics["reward"]["min"] == min(rewards) and metrics["reward"]["max"] == max(rewards)
    assert metrics["failure_rows_by_class"] == {
        "bad_row": 1,
        "incomplete_group": 3,
        "judge_failed": 4,
    }
    assert metrics["masked_rate"] == 4 / 12
    assert metrics["judge_comparisons"] == 8
    # Incomplete group never reached the server: only the two good groups and the
    # outage group were judged. The good groups' 8 comparisons took one request each;
    # the outage group's first failing request masks it at once, so how many of its four
    # pair requests were already sent depends on scheduling (1 to 4), never more.
    judged = fake_judge.stats()["total"] - warm
    assert 8 + 1 <= judged <= 8 + 4
    never = pair_texts(["Three.", "Five.", "Seven.", "Nine."])
    asked = fake_judge.stats()["pairs"]
    outage = pair_texts(OUTAGE)
    assert any(pair_key(a, b) in asked for a in outage for b in outage if a != b)
    assert not any(pair_key(a, b) in asked for a in never for b in never if a != b), (
        "a pair of the incomplete group was judged"
    )


async def test_zero_count_policy_decides_metrics_and_the_exit_code(
    fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    source = write_jsonl(
        tmp_path / "in.jsonl", gym_rows("Name a prime number.", GOOD_A, task_index=0)
    )
    fake_judge.set_faults(fail_400_rate=1.0)  # the judge is down: every group is masked
    async with cohort_server(fake_judge.url) as port:
        base = ["--server", f"127.0.0.1:{port}", "--input", str(source), "--no-progress"]
        plain = await main_async([*base, "--output", str(tmp_path / "plain.jsonl")])
        zero = await main_async(
            [
                *base,
                "--output",
                str(tmp_path / "zero.jsonl"),
                "--count-failure-classes-as-zero",
                "judge_failed",
            ]
        )
    assert plain == 1
    assert zero == 0
    assert read_jsonl(tmp_path / "plain.jsonl") == read_jsonl(tmp_path / "zero.jsonl") == []
    plain_m = json.loads((tmp_path / "plain.metrics.json").read_text())
    zero_m = json.loads((tmp_path / "zero.metrics.json").read_text())
    assert plain_m["reward"]["count"] == 0 and plain_m["reward"]["mean"] is None
    assert zero_m["reward"] == {"count": 4, "mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    assert zero_m["reward_usable_only"]["count"] == 0
    assert zero_m["zero_counted_rows"] == 4 and zero_m["masked_rate"] == 1.0


async def test_resume_resubmits_a_judge_failed_group_as_the_next_attempt_only(
    fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    rows = [
        *gym_rows("Name a prime number.", GOOD_A, task_index=0),
        *gym_rows("Name another prime number.", OUTAGE, group_id="outage", attempt=0),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "results.jsonl"
    fake_judge.set_faults(fail_400_first_n=1)
    prewarm_pairs(fake_judge, pair_texts(GOOD_A))
    async with cohort_server(fake_judge.url) as port:
        argv = [
            "--server",
            f"127.0.0.1:{port}",
            "--input",
            str(source),
            "--output",
            str(out),
            "--no-progress",
        ]
        assert await main_async(argv) == 0
        first = read_jsonl(out)
        assert [
            r["_ng_failure_class"] for r in read_jsonl(tmp_path / "results.failures.jsonl")
        ] == ["judge_failed"] * 4
        assert await main_async(argv) == 2  # outputs exist: --resume or --overwrite
        before = fake_judge.stats()["pairs"]
        assert await main_async([*argv, "--resume"]) == 0
        after = fake_judge.stats()["pairs"]
    results = read_jsonl(out)
    assert results[:4] == first
    assert [(r["_ng_group_id"], r["_ng_group_attempt"]) for r in results[4:]] == [("outage", 1)] * 4
    assert read_jsonl(tmp_path / "results.failures.jsonl") == []
    changed = {k for k in after if after[k] != before.get(k)}
    assert len(changed) == 4  # only the outage group's four pairs, once each
    assert all(after[k] == before.get(k, 0) + 1 for k in changed)
    assert all(before.get(k) == after.get(k) for k in before if k not in changed)
    metrics = json.loads((tmp_path / "results.metrics.json").read_text())
    assert metrics["this_run"]["groups_skipped_complete"] == 1
    assert metrics["usable_rewards"] == 8 and metrics["failure_rows_by_class"] == {}


async def test_strict_mode_refuses_a_file_with_bad_rows_before_submitting(
    fake_judge: FakeJudgeServer, tmp_path: Path
) -> None:
    rows: list[Any] = [*gym_rows("Name a prime number.", GOOD_A, task_index=0), {"response": {}}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    async with cohort_server(fake_judge.url) as port:
        code = await main_async(
            [
                "--server",
                f"127.0.0.1:{port}",
                "--input",
                str(source),
                "--output",
                str(tmp_path / "r.jsonl"),
                "--strict",
            ]
        )
    assert code == 2
    assert fake_judge.stats()["total"] == 0
    assert not (tmp_path / "r.jsonl").exists()


def test_rows_flatten_content_parts_and_report_bad_rows_with_line_numbers() -> None:
    parts = {
        "responses_create_params": {
            "instructions": "Be brief.",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Hello "},
                        {"type": "input_text", "text": "there"},
                    ],
                },
                {"type": "function_call", "name": "ignored"},
            ],
        },
        "response": {"output": []},
        "principle": "Prefer short answers.",
    }
    lines = [
        json.dumps(parts),
        json.dumps({"responses_create_params": {"input": "Hi"}, "response": {"output": []}}),
        json.dumps({"responses_create_params": {"input": 3}, "response": {"output": []}}),
        json.dumps({"responses_create_params": {"input": "Hi"}, "response": "text"}),
        json.dumps(
            {
                "responses_create_params": {"input": "Hi"},
                "response": {"output": []},
                "_ng_rollout_index": -1,
            }
        ),
        "",
        "[1, 2]",
    ]
    rows, bad, count = parse_lines(lines)
    assert count == 6
    assert rows[0].messages == (("system", "Be brief."), ("user", "Hello there"))
    assert rows[0].principle == "Prefer short answers."
    assert rows[1].messages == (("user", "Hi"),)
    assert [(b.line, b.reason.split(" ")[0]) for b in bad] == [
        (3, "'responses_create_params.input'"),
        (4, "'response'"),
        (5, "'_ng_rollout_index'"),
        (7, "a"),
    ]


def test_groups_form_by_id_then_task_and_prompt_and_detect_problems_up_front() -> None:
    rows_json = [
        *gym_rows("P", ["a", "b"], group_id="g"),
        *gym_rows("P", ["a", "b"], task_index=1),
        *gym_rows("P", ["a", "b"], task_index=2),
        *gym_rows("Q", ["a"], task_index=2),  # same task index, other prompt: own group
        *gym_rows("P", ["a", "b"], group_id="dup", indices=iter([0, 0])),
    ]
    rows, bad, _ = parse_lines(json.dumps(r) for r in rows_json)
    groups, superseded = form_groups(rows, None)
    assert not bad and not superseded
    assert [g.key.split(":")[0] for g in groups] == ["id", "task", "task", "task", "id"]
    assert [g.size for g in groups] == [2, 2, 2, 2, 2]
    assert [g.problem[0] if g.problem else None for g in groups] == [
        None,
        None,
        None,
        "incomplete_group",
        "invalid",
    ]
