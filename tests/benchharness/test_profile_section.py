"""The `profile` section of `make bench`: py-spy on real servers (one on `memory://`, one
on the default store), the server's CPU per thread over the same runs, and what the
report says about the default store's 1-member figure.

The unit tests feed the summarising functions py-spy's and /proc's formats by hand; the
end-to-end test runs the section, small, against real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from bench.mpreport import profile_findings, same_work_findings
from bench.multiproc import (
    MultiPlan,
    find_py_spy,
    python_threads,
    run_multi,
    summarise_profile,
    thread_rows,
)

RAW = "\n".join(
    [
        "thread (100): MainThread;run (asyncio/runners.py:190);"
        "CohortServicer.SubmitMember (/x/genrm_grpc/server/servicer.py:139) 6",
        "thread (100): MainThread;Handle._run (asyncio/events.py:80) 2",
        "thread (107): genrm-sqlite-writer;SqliteStore._run (/x/genrm_grpc/store/sqlite.py:296) 2",
    ]
)


def test_a_threaded_profile_counts_each_threads_gil_share_and_keeps_functions_without_it() -> None:
    summary = summarise_profile(RAW)
    assert summary["samples"] == 10
    assert sorted(summary["threads"]) == [
        [100, "MainThread", 80.0],
        [107, "genrm-sqlite-writer", 20.0],
    ]
    functions = dict(map(tuple, summary["self"]))
    assert functions["CohortServicer.SubmitMember (genrm_grpc/server/servicer.py)"] == 60.0
    assert not any(f.startswith("thread") for f in functions)


def test_thread_rows_name_python_threads_sum_pools_and_drop_idle_threads() -> None:
    before = {
        100: ("genrm-grpc", 1.0, 0.5),
        101: ("event_engine", 0.0, 0.0),
        102: ("event_engine", 0.1, 0.1),
        103: ("genrm-grpc", 0.0, 0.0),
        104: ("grpc_global_tim", 0.0, 0.0),
        107: ("genrm-grpc", 0.2, 0.0),
    }
    after = {
        100: ("genrm-grpc", 3.0, 1.0),
        101: ("event_engine", 0.1, 0.1),
        102: ("event_engine", 0.2, 0.2),
        103: ("genrm-grpc", 0.0, 0.1),
        104: ("grpc_global_tim", 0.0, 0.0),
        107: ("genrm-grpc", 0.4, 0.2),
    }
    spied = [[100, "MainThread", 80.0], [107, "genrm-sqlite-writer", 20.0]]
    dumped = {100: "MainThread", 103: "Thread-1 (_poll_wrapper)", 107: "genrm-sqlite-writer"}
    rows = {r["thread"]: r for r in thread_rows(100, before, after, spied, 10_000, dumped)}
    assert set(rows) == {
        "MainThread (the event loop)",
        "genrm-sqlite-writer",
        "event_engine",
        "Thread-1 (_poll_wrapper)",
    }
    loop = rows["MainThread (the event loop)"]
    assert (loop["user_us"], loop["system_us"], loop["gil_pct"]) == pytest.approx((200, 50, 80))
    assert rows["event_engine"]["threads"] == 2
    assert rows["event_engine"]["user_us"] == pytest.approx(20)
    assert rows["genrm-sqlite-writer"]["gil_pct"] == 20.0


def _single(echo: float, memory: float, sqlite: float) -> dict[str, Any]:
    def side(cpu: float) -> dict[str, Any]:
        return {"cpu_us_per_member": {"median": cpu}}

    ratios = {"service": {"median": 0.48}, "service-sqlite": {"median": 0.44}}
    summary = {
        "ratio": ratios["service"],
        "ratios": ratios,
        "service": side(memory),
        "service-sqlite": side(sqlite),
        "echo": side(echo),
    }
    # StreamGroups above its target: nothing said of it.
    stream = {"ratio": {"median": 0.7}, "ratios": {"service": {"median": 0.7}}}
    return {"single": {"summary": {"SubmitMember": summary, "StreamGroups": stream}}}


def test_the_default_stores_miss_is_split_into_the_service_path_and_the_store() -> None:
    [finding] = [f for f in same_work_findings(_single(160, 360, 420)) if "default store" in f]
    assert "Of the 260 µs between them, 200 µs is the service's own path" in finding
    assert "and 60 µs is the store" in finding
    assert "Most of the distance is the service path" in finding
    assert "misses its own target too" in finding  # 0.48× against its 0.6×


def test_a_store_that_costs_more_than_the_service_path_is_not_called_the_lesser_part() -> None:
    [finding] = [f for f in same_work_findings(_single(160, 200, 420)) if "default store" in f]
    assert "40 µs is the service's own path" in finding
    assert "and 220 µs is the store" in finding
    assert "Most of the distance is the service path" not in finding


def test_a_sqlite_side_cheaper_than_memory_in_its_rounds_is_not_given_a_negative_store() -> None:
    [finding] = [f for f in same_work_findings(_single(160, 380, 370)) if "default store" in f]
    assert "the SQLite side used 10 µs less than `memory://`" in finding
    assert "-10" not in finding


PLAN = MultiPlan(
    group_size=4,
    in_flight=2,
    warmup_groups=1,
    concurrency=8,
    answer_bytes=256,
    single_in_flight=8,
    profile_s=1.0,
    sections=("profile",),
)


@pytest.mark.e2e
def test_the_sqlite_profile_shows_the_writer_thread_beside_the_event_loop() -> None:
    _py_spy_here()
    out: dict[str, Any] = {}
    run_multi(PLAN, out)
    profile = out["profile"]
    assert set(profile) == {"SubmitMember", "StreamGroups", "judge", "sqlite", "sqlite-judge"}
    for label, p in profile.items():
        assert "error" not in p, (label, p.get("error"))
        threads = {r["thread"]: r for r in p["by_thread"]}
        loop = threads["MainThread (the event loop)"]
        assert loop["user_us"] > 0 and loop["gil_pct"] > 0
        assert ("genrm-sqlite-writer" in threads) == label.startswith("sqlite")
    for label in ("sqlite", "sqlite-judge"):
        writer = {r["thread"]: r for r in profile[label]["by_thread"]}["genrm-sqlite-writer"]
        assert writer["user_us"] + writer["system_us"] > 0


def _profiled(loop: tuple[float, float], writer: tuple[float, float] | None) -> dict[str, Any]:
    rows = [{"thread": "MainThread (the event loop)", "user_us": loop[0], "system_us": loop[1]}]
    if writer is not None:
        rows.append({"thread": "genrm-sqlite-writer", "user_us": writer[0], "system_us": writer[1]})
    for row in rows:
        row.update(threads=1, gil_pct=90.0 if row["thread"].startswith("Main") else 10.0)
    return {
        "by_thread": rows,
        "cpu_us_per_member": sum(r["user_us"] + r["system_us"] for r in rows),
    }


def test_each_sqlite_profile_is_read_against_the_memory_profile_of_the_same_work() -> None:
    profile = {
        "SubmitMember": _profiled((250, 45), None),
        "judge": _profiled((340, 60), None),
        "sqlite": _profiled((255, 60), (30, 40)),
        "sqlite-judge": _profiled((330, 55), (60, 70)),
    }
    one, sixteen = profile_findings({"profile": profile})[-2:]
    assert one.startswith("- **1-member SubmitMember on SQLite**: 385 µs")
    assert "writer thread used 30 µs of user and 40 µs of system time" in one
    assert "20 µs more than on `memory://` in its own run (250 and 45 µs)" in one
    assert sixteen.startswith("- **16-member SubmitMember (judge calls) on SQLite**")
    assert "15 µs less than on `memory://` in its own run (340 and 60 µs)" in sixteen


def _py_spy_here() -> str:
    """py-spy, or a skip where this machine forbids reading another process's memory (a
    container without ptrace permission): ``make bench``'s profiles need it too."""
    spy = find_py_spy()
    assert spy is not None, "py-spy is part of the bench extra"
    probe = subprocess.run(
        [spy, "dump", "--pid", str(os.getpid()), "--nonblocking"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0 and "ermission" in probe.stdout + probe.stderr:
        pytest.skip(f"py-spy may not read processes here: {probe.stderr.strip()[:200]}")
    return spy


def test_thread_names_come_from_a_real_py_spy_dump_of_a_process() -> None:
    spy = _py_spy_here()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time, sys\n"
            "t = threading.Thread(target=time.sleep, args=(60,), name='named-by-test')\n"
            "t.start(); print('ready', flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        names = python_threads(spy, child.pid)
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
    assert names[child.pid] == "MainThread"
    assert "named-by-test" in names.values()
