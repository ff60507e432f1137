"""``genrm-grpc demo`` (``make demo``): the whole job end to end on loopback.

Starts the fake judge (a deterministic test double, not a model) and the server as
subprocesses on free ports, then, over real gRPC with the generated client:

1. ``Compare``: each example prompt of NeMo Gym's genrm_compare data with four answers
   of different quality, printed as a reward table;
2. ``StreamGroups``: one whole group attempt pushed on a stream, with acceptances,
   judging progress and rewards printed as they arrive;
3. ``genrm-grpc collect`` (a subprocess) over ``data/demo_rollouts.jsonl``, a small Gym
   rollout file built from the example prompts, printing the rewards table and the
   metrics summary of its outputs;
4. a restart that loses nothing (``restart_act`` in ``demo_restart.py``): a group is
   submitted to a server in front of a slow fake judge, the server is SIGKILLed once the
   store file holds some journaled verdicts, started again on the same file, and the
   members are resent: only the passes the journal lacked are judged; an identical
   resend after completion costs no judge call at all;

and stops everything. Every server of the demo keeps its store in a temporary
directory, never in the working directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from pathlib import Path

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, status_error_info

# Four answers per prompt, best first by intent: a complete answer, a terse one, an
# off-topic one, and an empty one (judged as the literal "None").
ANSWERS: dict[int, list[str]] = {
    0: [
        'The right option is "conflict": to conflict means to fit so poorly together that '
        "the differences cause a problem, as when two meeting times conflict. Symbolic, "
        "hedonistic and phonetic describe symbols, pleasure-seeking and speech sounds.",
        "conflict",
        "The answer is phonetic, because the words sound different when spoken.",
        "",
    ],
    1: [
        '"SKILL" usually means the ability to do something well, gained through training '
        "and practice. Written in capitals it can also be SKILL, the Lisp-based scripting "
        "language of Cadence electronic design tools, used to automate chip layout tasks.",
        "A skill is something you are good at.",
        "SKILL is a brand of kitchen appliances.",
        "",
    ],
    2: [
        "Externalities are effects of an activity on third parties that prices do not "
        "capture. A positive externality, such as vaccination or a company training "
        "workers who later move on, benefits others, so markets under-supply it. A negative "
        "externality, such as factory pollution or traffic congestion, harms others, so "
        "markets over-supply it. Governments mitigate negative externalities with "
        "Pigouvian taxes (carbon taxes), tradable permits (emissions trading schemes), "
        "direct regulation and standards (emission limits), and liability rules, and "
        "sustainable organisations respond by pricing their own externalities internally.",
        "Positive externalities help others and negative ones harm others; governments "
        "use taxes and rules against the negative ones.",
        "Sustainable organisations should recycle more and use less paper.",
        "",
    ],
    3: [
        "Reinforcement learning is a way for an agent to learn which actions to take by "
        "trying them in an environment and adjusting its behaviour to maximise reward.",
        "Learning from rewards.",
        "Reinforcement learning is when you repeat a lesson until you remember it.",
        "",
    ],
    4: [
        "Unit testing catches bugs early, close to the code that causes them, and it makes "
        "refactoring safer because the tests show that behaviour did not change.",
        "Fewer bugs and safer changes.",
        "Unit tests make the program run faster.",
        "",
    ],
}


def load_prompts() -> list[list[tuple[str, str]]]:
    data = resources.files("genrm_grpc.data").joinpath("gym_genrm_example_prompts.jsonl")
    prompts = []
    for line in data.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            turns = row["responses_create_params"]["input"]
            prompts.append([(t["role"], t["content"]) for t in turns])
    return prompts


def to_prompt(turns: list[tuple[str, str]]) -> pb.Prompt:
    return pb.Prompt(messages=[pb.ChatMessage(role=r, content=c) for r, c in turns])


@contextlib.contextmanager
def _process(
    args: list[str], ready_prefix: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start a subprocess and wait for its one-line readiness announcement."""
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith(ready_prefix):
            raise RuntimeError(f"{args[3]} did not start (said {line!r})")
        yield proc, line[len(ready_prefix) :].strip()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # the readiness line's pipe


@contextlib.contextmanager
def running_stack(
    extra_server_args: list[str] | None = None, *, store: str | None = None
) -> Iterator[tuple[str, str]]:
    """Fake judge + server on free loopback ports; yields (judge_url, grpc_target).

    ``store`` is the server's ``store`` URL (``GENRM_STORE``); by default the server's
    own default applies (or ``GENRM_STORE`` of the caller's environment)."""
    py = [sys.executable, "-m", "genrm_grpc.cli"]
    with _process([*py, "fake-judge", "--port", "0"], "fake-judge listening on") as (_, url):
        server_args = [
            *py,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--judge-url",
            url,
            "--num-rollouts-per-prompt",
            "4",
            "--genrm-parse-retry-sleep-s",
            "0.05",
            "--log-level",
            "WARNING",
            *(extra_server_args or []),
        ]
        env = {"GENRM_STORE": store} if store is not None else None
        with _process(server_args, "genrm-grpc serving on", env) as (_, target):
            yield url, target


def _short(text: str, width: int) -> str:
    flat = " ".join(text.split()) or "(empty → judged as None)"
    return flat if len(flat) <= width else flat[: width - 1] + "…"


async def _compare_table(client: CohortClient, prompts: list[list[tuple[str, str]]]) -> None:
    print("\n== Compare: one reward per candidate, relative to its siblings ==")
    for n, turns in enumerate(prompts):
        answers = ANSWERS[n % len(ANSWERS)]
        reply = await client.compare(
            to_prompt(turns), [pb.Candidate(output_text=a) for a in answers], timeout=60
        )
        print(f"\nprompt {n}: {_short(turns[-1][1], 70)}")
        print(f"  {'#':>2}  {'reward':>7}  answer")
        for k, (answer, reward) in enumerate(zip(answers, reply.rewards, strict=True)):
            print(f"  {k:>2}  {reward:7.3f}  {_short(answer, 60)}")
        tie_rate = reply.metrics.get("tiebreak_usage_rate", 0.0)
        print(f"      {len(reply.comparisons)} comparisons, tiebreak_usage_rate={tie_rate:.2f}")


async def _stream_group(client: CohortClient, turns: list[tuple[str, str]]) -> None:
    print("\n== StreamGroups: one group attempt, rewards published together ==")
    answers = ANSWERS[3]
    prompt = to_prompt(turns)

    async def members() -> AsyncIterator[pb.SubmitMemberRequest]:
        for k, answer in enumerate(answers):
            yield pb.SubmitMemberRequest(
                member=pb.MemberRef(
                    group_id="demo-group", group_attempt=0, rollout_index=k, group_size=4
                ),
                prompt=prompt,
                candidate=pb.Candidate(output_text=answer),
            )

    async for event in client.stream_groups(members(), timeout=60):
        kind = event.WhichOneof("event")
        if kind == "accepted":
            print(f"  accepted     member {event.accepted.member.rollout_index}")
        elif kind == "pair_judged":
            p = event.pair_judged
            print(f"  pair judged  ({p.response_i}, {p.response_j}) judge {p.judge_index}")
        elif kind == "result":
            r = event.result
            print(
                f"  reward       member {r.member.rollout_index}: {r.reward:.3f}  "
                f"({_short(answers[r.member.rollout_index], 50)})"
            )
        else:
            err = status_error_info(event.error.status)
            print(f"  error        member {event.error.member.rollout_index}: {err.reason}")
    info = await client.get_cohort(pb.MemberRef(group_id="demo-group", group_attempt=0))
    print(f"  GetCohort    {info.key}: {pb.CohortPhase.Name(info.phase)}")


async def _run(target: str) -> None:
    prompts = load_prompts()
    async with CohortClient(target) as client:
        await _compare_table(client, prompts)
        await _stream_group(client, prompts[3])


def _collect(target: str) -> None:
    print("\n== genrm-grpc collect: a Gym rollout file scored end to end ==")
    source = resources.files("genrm_grpc.data").joinpath("demo_rollouts.jsonl")
    with tempfile.TemporaryDirectory() as tmp, resources.as_file(source) as rollouts:
        out = Path(tmp) / "results.jsonl"
        command = [sys.executable, "-m", "genrm_grpc.cli", "collect", "--server", target]
        command += ["--input", str(rollouts), "--output", str(out), "--concurrency", "4"]
        print("$ genrm-grpc collect --server", target, "--input demo_rollouts.jsonl", end="")
        print(" --output results.jsonl --concurrency 4")
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        for line in done.stderr.splitlines()[-2:]:
            print(f"  {line}")
        if done.returncode != 0:
            raise RuntimeError(f"genrm-grpc collect exited with {done.returncode}")
        rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        metrics = json.loads(out.with_name("results.metrics.json").read_text())
    print(f"\n  {'task':>4}  {'#':>2}  {'reward':>7}  answer")
    for row in sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"])):
        answer = "".join(
            part.get("text", "")
            for item in row["response"]["output"]
            if item.get("type") == "message"
            for part in item.get("content", [])
        )
        print(
            f"  {row['_ng_task_index']:>4}  {row['_ng_rollout_index']:>2}  "
            f"{row['reward']:7.3f}  {_short(answer, 56)}"
        )
    reward = metrics["reward"]
    print(
        f"\n  metrics: {metrics['usable_rewards']} usable rewards, mean {reward['mean']:.3f}, "
        f"std {reward['std']:.3f}, min {reward['min']:.3f}, max {reward['max']:.3f}; "
        f"masked rate {metrics['masked_rate']:.2f}; failures "
        f"{metrics['failure_rows_by_class'] or 'none'}; "
        f"{metrics['judge_comparisons']} judge comparisons"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="genrm-grpc demo",
        description="Start the fake judge (a test double, not a model) and the server on "
        "free loopback ports, score the example prompts with Compare, push one group "
        "through StreamGroups, score a small rollout file with genrm-grpc collect, kill "
        "a server mid-evaluation and restart it on the same store file, and stop "
        "everything.",
    )
    parser.parse_args(argv)
    print("starting the fake judge (a deterministic test double, not a model) and the server…")
    with tempfile.TemporaryDirectory(prefix="genrm-demo-") as tmp:
        store = f"sqlite:///{Path(tmp).resolve() / 'genrm-state.sqlite3'}"
        with running_stack(store=store) as (url, target):
            print(f"fake judge at {url}, genrm-grpc at {target}")
            print(f"store: {store} (a temporary directory, removed at the end)")
            asyncio.run(_run(target))
            _collect(target)
        from genrm_grpc.demo_restart import print_restart, restart_act

        latency = 400
        print_restart(restart_act(Path(tmp), latency), latency)
    print("\nstopped the servers and the fake judges.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
