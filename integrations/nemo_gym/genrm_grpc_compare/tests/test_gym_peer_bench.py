"""The "vs NeMo Gym genrm_compare" bench section, tiny, so that its harness cannot rot:
Gym 0.4.0's own servers and ours as real processes in front of one fake judge."""

from __future__ import annotations

import argparse
import pathlib

from bench import gym_peer


def test_tiny_gym_peer_run_measures_every_side_and_counts_gyms_fault_bugs_but_none_of_ours(
    tmp_path: pathlib.Path,
) -> None:
    args = argparse.Namespace(
        rounds=2,
        groups=1,
        in_flight=1,
        answer_bytes=256,
        latency_ms=5.0,
        timeout_s=4.0,
        collection_timeout_s=1.0,
        logs=str(tmp_path),
    )
    result = gym_peer.run(args)

    summary = result["throughput"]["summary"]
    for side in gym_peer.SIDES:
        assert summary[side]["errors"] == 0, result["throughput"]["rounds"][side]
        assert summary[side]["members"] == 2 * gym_peer.SIZE
        assert summary[side]["members_per_s"]["median"] > 0
        assert summary[side]["cpu_ms_per_member"]["median"] > 0
        # circular strategy: one judge call per member on every side
        assert summary[side]["judge_calls_per_member"]["median"] == 1.0

    gym, ours = result["faults"]["gym"], result["faults"]["ours-http"]
    for key, _ in gym_peer.FAULT_ROWS:
        assert ours[key] == 0, (key, ours["replies"])
    # 0.4.0 buffers by prompt with no collection deadline: the incomplete group's
    # callers never get an answer; a 400 for every pair of a group becomes default scores.
    assert gym["callers_left_waiting"] >= gym_peer.FAULT_SIZE - 1, gym["replies"]
    assert gym["judge_errors_as_rewards"] == gym_peer.FAULT_SIZE, gym["replies"]
    # ours masks that group instead of scoring it
    masked = [r for r in ours["replies"] if r["scenario"] in ("judge503", "judge400")]
    assert len(masked) == 2 * gym_peer.FAULT_SIZE and all(r["masked"] for r in masked)

    text = gym_peer.markdown(result)
    assert "simulated" in text and "0.4.0" in text
