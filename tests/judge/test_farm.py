"""The farm's decisions (sans-IO): routing, bounded load, ejection, readmission, hedging.

An injected clock; no network. The end-to-end behaviour over real processes is in
tests/e2e/test_judge_farm.py.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from genrm_grpc.judge.farm import EndpointState, Farm, HedgePolicy, OutlierPolicy
from genrm_grpc.judge.stats import quantile
from genrm_grpc.testing.clock import ManualClock

URLS = [f"http://10.0.0.{n}:8000" for n in range(1, 5)]


def _farm(urls: list[str] = URLS, **kw: object) -> tuple[Farm, ManualClock]:
    clock = ManualClock()
    max_in_flight = int(kw.pop("max_in_flight", 100))  # type: ignore[call-overload]
    farm = Farm(urls, max_in_flight=max_in_flight, display=str, clock=clock.now, **kw)  # type: ignore[arg-type]
    return farm, clock


def test_one_cohorts_requests_prefer_one_endpoint_while_it_is_within_its_share() -> None:
    farm, _ = _farm()
    first = farm.pick("cohort-a")
    assert first is not None
    for _ in range(3):
        chosen = farm.pick("cohort-a")
        assert chosen is first
        farm.take(chosen)
    assert farm.affinity_kept == 4 and farm.affinity_spilled == 0


def test_no_endpoint_runs_above_the_load_factor_times_the_mean() -> None:
    farm, _ = _farm(load_factor=1.25, max_in_flight=64, capacity=64)
    rng = random.Random(7)
    low_load_floor = 1.25 * 64 / 4
    for n in range(240):
        chosen = farm.pick(f"cohort-{rng.randrange(40)}")
        assert chosen is not None
        farm.take(chosen)
        total = sum(e.in_flight for e in farm.endpoints)
        mean = total / len(farm.endpoints)
        top = max(e.in_flight for e in farm.endpoints)
        assert top <= max(1.25 * mean + 1, low_load_floor), n


def test_no_endpoint_idles_below_the_mean_behind_a_skew_of_the_keys_in_flight() -> None:
    # Eight cohorts of four passes each, all keyed to the same preferred endpoint: a
    # bound from above alone would leave it and its ring successor full and the others
    # empty; the bound from below gives every endpoint at least (2 - 1.25) x the mean.
    farm, _ = _farm(load_factor=1.25, max_in_flight=64, capacity=32)
    preferred = farm.pick("seed")
    keys = [k for k in (f"cohort-{n}" for n in range(10_000)) if farm.pick(k) is preferred][:8]
    for key in keys:
        for _ in range(4):
            chosen = farm.pick(key)
            assert chosen is not None
            farm.take(chosen)
    loads = [e.in_flight for e in farm.endpoints]
    mean = sum(loads) / len(loads)
    assert sum(loads) == 32 and min(loads) >= 0.75 * mean - 1, loads
    assert max(loads) <= 1.25 * mean + 1, loads
    assert farm.affinity_kept > farm.affinity_spilled


def test_a_full_endpoint_takes_nothing_and_acquire_waits_for_a_release() -> None:
    async def run() -> None:
        farm, _ = _farm(URLS[:1], max_in_flight=1)
        held = await farm.acquire("k")
        waiting = asyncio.ensure_future(farm.acquire("k"))
        await asyncio.sleep(0)
        assert not waiting.done()
        farm.release(held)
        assert await waiting is held

    asyncio.run(run())


def test_a_retry_avoids_the_endpoint_that_failed_unless_it_is_the_only_one() -> None:
    farm, _ = _farm()
    first = farm.pick("k")
    assert first is not None
    assert farm.pick("k", [first]) is not first
    single, _ = _farm(URLS[:1])
    only = single.endpoints[0]
    assert single.pick("k", [only]) is only


def test_a_farm_of_one_sends_to_its_endpoint_whatever_its_health_until_its_limit() -> None:
    farm, _ = _farm(URLS[:1], max_in_flight=2)
    only = farm.endpoints[0]
    farm.wrong_model(only, "serves other-model")  # out, but there is nowhere else to send
    assert farm.try_acquire("k") is only and farm.try_acquire(None, [only]) is only
    assert farm.try_acquire("k") is None and only.in_flight == 2
    farm.release(only)
    assert farm.pick("k") is only


def test_consecutive_failures_eject_for_a_time_that_grows_with_each_ejection() -> None:
    farm, clock = _farm(outliers=OutlierPolicy(consecutive_failures=3, base_ejection_s=30))
    sick = farm.endpoints[0]
    for _ in range(3):
        farm.failed(sick, "transport", "refused")
    assert sick.state is EndpointState.EJECTED and sick.ejected_until == clock.now() + 30
    assert farm.due_for_readmission_probe() == []
    clock.advance(30)
    assert farm.due_for_readmission_probe() == [sick]
    farm.readmit(sick, "probe passed")
    assert sick.state is EndpointState.HEALTHY
    for _ in range(3):
        farm.failed(sick, "http_5xx", "HTTP 503")
    assert sick.ejected_until == clock.now() + 60  # second ejection: twice as long


def test_an_answer_between_failures_resets_the_count() -> None:
    farm, _ = _farm(outliers=OutlierPolicy(consecutive_failures=3))
    node = farm.endpoints[0]
    farm.failed(node, "transport", "x")
    farm.failed(node, "transport", "x")
    farm.succeeded(node, 1.0)
    farm.failed(node, "transport", "x")
    assert node.state is EndpointState.HEALTHY


def test_never_more_than_max_ejection_percent_of_the_farm_is_out_and_one_alone_never() -> None:
    farm, _ = _farm(outliers=OutlierPolicy(consecutive_failures=1, max_ejection_percent=50))
    for endpoint in farm.endpoints:
        farm.failed(endpoint, "transport", "down")
    assert sum(e.state is EndpointState.EJECTED for e in farm.endpoints) == 2
    alone, _ = _farm(URLS[:1], outliers=OutlierPolicy(consecutive_failures=1))
    alone.failed(alone.endpoints[0], "transport", "down")
    assert alone.endpoints[0].state is EndpointState.HEALTHY


def test_with_no_healthy_endpoint_requests_still_go_out_panic_routing() -> None:
    farm, _ = _farm(URLS[:2])
    for endpoint in farm.endpoints:
        farm.wrong_model(endpoint, "serves another model")
    assert farm.pick("k") is not None


def test_a_vanished_endpoint_takes_nothing_new_and_leaves_once_its_requests_end() -> None:
    farm, _ = _farm(URLS[:2])
    gone = farm.endpoints[1]
    farm.take(gone)
    farm.set_urls(URLS[:1])
    assert gone.state is EndpointState.DRAINING and gone in farm.endpoints
    assert all(farm.pick(f"k{n}") is farm.endpoints[0] for n in range(20))
    farm.release(gone)
    assert gone not in farm.endpoints
    farm.set_urls(URLS[:3])
    assert len(farm.endpoints) == 3


def test_an_endpoint_with_requests_waiting_in_its_own_queue_gets_none_while_another_has_none() -> (
    None
):
    farm, _ = _farm(URLS[:2])
    busy, idle = farm.endpoints
    busy.queue_waiting = 5
    idle.queue_waiting = 0
    assert all(farm.pick(f"k{n}") is idle for n in range(20))
    idle.queue_waiting = 3
    assert {farm.pick(f"k{n}") for n in range(20)} == {busy, idle}  # all queue: any


def test_the_adaptive_hedge_point_follows_the_judges_latency_and_hedges_about_one_percent() -> None:
    # A healthy judge answering in 6-11 s: a fixed 5 s hedge would hedge every call.
    farm, _ = _farm(URLS[:2], hedging=HedgePolicy(quantile=0.99, floor_s=2.0, min_samples=32))
    node = farm.endpoints[0]
    rng = random.Random(3)
    assert farm.hedge_after(node) is None  # no latencies yet: no hedging
    latencies = [rng.uniform(6, 11) for _ in range(256)]
    for seconds in latencies:
        farm.succeeded(node, seconds)
    point = farm.hedge_after(node)
    assert point is not None and 10.5 < point <= 11
    fresh = [rng.uniform(6, 11) for _ in range(10_000)]
    assert sum(s > point for s in fresh) / len(fresh) < 0.03


def test_a_fixed_hedge_point_replaces_the_adaptive_one_and_one_endpoint_has_no_adaptive() -> None:
    farm, _ = _farm(URLS[:2], hedging=HedgePolicy(fixed_s=5.0))
    assert farm.hedge_after(farm.endpoints[0]) == 5.0
    single, _ = _farm(URLS[:1], hedging=HedgePolicy(min_samples=1))
    single.succeeded(single.endpoints[0], 1.0)
    assert single.hedge_after(single.endpoints[0]) is None


def test_quantile_is_the_ceiling_rank() -> None:
    assert quantile([1, 2, 3, 4], 0.5) == 2
    assert quantile([1, 2, 3, 4], 0.99) == 4
    with pytest.raises(ValueError):
        quantile([], 0.5)


@pytest.mark.parametrize("routing", ["round_robin", "hash", "least_loaded"])
def test_the_comparison_routings_use_every_endpoint(routing: str) -> None:
    farm, _ = _farm(routing=routing)
    seen = set()
    for n in range(200):
        chosen = farm.pick(f"cohort-{n}")
        assert chosen is not None
        farm.take(chosen)
        seen.add(chosen.url)
    assert seen == set(URLS)


def test_hash_routing_pins_a_cohort_whatever_the_load() -> None:
    farm, _ = _farm(routing="hash")
    first = farm.pick("cohort-a")
    assert first is not None
    for _ in range(50):
        chosen = farm.pick("cohort-a")
        assert chosen is first
        farm.take(chosen)
