"""The replicas section of `make bench` (bench/replicas.py): how it counts Redis work,
and a small run end to end.

The counting tests drive a real redis-server with known traffic and check each figure
the section reports; the small run starts the section's real processes (servers on
`memory://` and on two redis-servers, the bench judge, the load generator).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
import redis

from bench import replicas
from bench.multiproc import MultiPlan, run_multi
from genrm_grpc.testing.redis_server import RedisServer


@pytest.fixture(scope="module")
def client() -> Iterator[redis.Redis]:
    with RedisServer() as server:
        conn = redis.Redis(host="127.0.0.1", port=server.port)
        yield conn
        conn.close()


def test_a_pipeline_is_one_round_trip_of_as_many_commands_as_it_carries(
    client: redis.Redis,
) -> None:
    before = replicas.redis_counters(client)
    pipe = client.pipeline(transaction=False)
    for n in range(20):
        pipe.set(f"k{n}", "v")
    pipe.execute()
    delta = replicas.redis_delta(before, replicas.redis_counters(client), subscribers=0)
    assert (delta["commands"], delta["round_trips"], delta["reads"]) == (20, 1, 1)
    assert delta["calls"] == {"set": 20}


def test_a_script_is_one_round_trip_and_counts_the_commands_it_runs(
    client: redis.Redis,
) -> None:
    script = client.register_script("redis.call('SET', KEYS[1], '1'); redis.call('GET', KEYS[1])")
    script(keys=["s"])  # loads it (EVALSHA refused, then EVAL): outside the measurement
    before = replicas.redis_counters(client)
    script(keys=["s"])
    delta = replicas.redis_delta(before, replicas.redis_counters(client), subscribers=0)
    assert (delta["commands"], delta["scripts"], delta["round_trips"]) == (3, 1, 1)
    assert delta["calls"] == {"evalsha": 1, "set": 1, "get": 1}


def test_messages_pushed_to_subscribers_are_not_counted_as_round_trips(
    client: redis.Redis,
) -> None:
    listeners = [client.pubsub() for _ in range(2)]
    try:
        for pubsub in listeners:
            pubsub.subscribe(replicas.CHANNEL)
            assert pubsub.get_message(timeout=10)["type"] == "subscribe"
        assert replicas._subscribers(client) == 2
        before = replicas.redis_counters(client)
        client.publish(replicas.CHANNEL, "ended")
        for pubsub in listeners:  # both got it before the second snapshot
            assert pubsub.get_message(timeout=10)["data"] == b"ended"
        delta = replicas.redis_delta(before, replicas.redis_counters(client), subscribers=2)
        assert (delta["round_trips"], delta["pushes"], delta["commands"]) == (1, 2, 1)
    finally:
        for pubsub in listeners:
            pubsub.close()


PLAN = MultiPlan(
    rounds=1,
    group_size=4,
    in_flight=2,
    groups=3,
    warmup_groups=1,
    concurrency=8,
    answer_bytes=256,
    sections=("replicas",),
)


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    out: dict[str, Any] = {}
    run_multi(PLAN, out)
    out["multi_plan"] = asdict(PLAN)
    out["machine"] = {"cores": 2}
    return out


@pytest.mark.e2e
def test_every_variant_judges_each_member_once_and_masks_nothing(
    results: dict[str, Any],
) -> None:
    rep = results["replicas"]
    assert rep["sides"] == ["memory", "redis-1", "redis-3"]
    assert rep["appendfsync"] == "always"
    for api in ("SubmitMember", "StreamGroups"):
        for side in rep["sides"]:
            figures = rep["summary"][api][side]
            assert figures["judge_calls_per_member"]["median"] == 1.0  # circular
            assert figures["masked"] == 0
    runs = {(r["side"], r["api"]): r for r in rep["runs"]}
    assert {r["members"] for r in runs.values()} == {PLAN.groups * PLAN.group_size}


@pytest.mark.e2e
def test_redis_work_is_counted_for_the_redis_variants_only_and_three_replicas_share_one(
    results: dict[str, Any],
) -> None:
    rep = results["replicas"]
    for run in rep["runs"]:
        if run["side"] == "memory":
            assert "redis" not in run
            continue
        redis_figures = run["redis"]
        # Each group needs at least one read and one commit script, and ends in one
        # message pushed to every subscribed replica.
        assert redis_figures["scripts"] >= 2 * PLAN.groups
        assert 0 < redis_figures["round_trips"] <= redis_figures["commands"]
        assert run["subscribers"] == run["replicas"] == (3 if run["side"] == "redis-3" else 1)
        assert redis_figures["pushes"] == PLAN.groups * run["subscribers"]


@pytest.mark.e2e
def test_the_report_has_the_section_and_one_target_row_per_api(
    results: dict[str, Any],
) -> None:
    text = replicas.markdown(results)
    assert text.startswith("## 12. Replicas on a shared Redis")
    rows = replicas.target_rows(results)
    assert [r[0].split(":")[0] for r in rows] == ["SubmitMember", "StreamGroups"]
    assert all(r[2][0] in "✔✘" for r in rows)
