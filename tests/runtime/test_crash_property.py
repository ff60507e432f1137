"""Property: crashes never change an outcome, and never make a finished pass be paid twice.

A random script interleaves first submissions of the members of a few groups, judge
completions (a verdict, or a failure for a "poisoned" question), group commits of the
store, clients hanging up (a waiting call dropped, then sent again), and crashes. The
same script is run once without its crashes and hang-ups; every member must get the
same answer in both runs (the same reward, or the same masked / failed kind).

Everything is real except the judge (a ScriptedJudge) and time (a ManualClock that moves
only to run the store's rewrites and the runtime's sweeps): one process, one SQLite file
per run, the runtime over the in-process group store with the file behind it, as a
single process serves. The script's ``fail`` step makes every waiting batch fail as a
full disk would (nothing written, the runtime told so); the client then resends the
calls that got ``STORE_UNAVAILABLE``, as it does for any ``UNAVAILABLE``. The runtime
held nothing of such a call and decides the resend afresh.

How a crash is modelled. The store is a real :class:`SqliteStore` whose batches wait in
this process, as if its writer thread had not got to them yet, until the script's
``commit`` hands every waiting batch to the writer (one group commit) and the runtime
hears that they are durable. A crash then

- optionally commits what waits *without* telling the runtime (the process died between
  the commit and its acknowledgement: e.g. a tombstone is in the file, nobody was told);
- drops every batch still waiting (records not yet committed are lost, as in a real
  crash), and lets nothing through from now on;
- cancels the runtime's tasks and the clients' calls (the connections drop) and closes
  the writer with an empty queue (nothing more reaches the file), releasing the file's
  lock as the kernel does for a killed process. (The runtime is stopped by its drain,
  which then writes nothing: what it does is lost with the process's memory.)

A commit counts once the file has it and completes by a callback
on the write, whoever waited for it: a batch committed is in the file and is what the
next process reads, acknowledged or not, and a batch still waiting is lost with its
decision, as if it had never been made.

So a crash can land between a judge completion and its journal commit, between a
member's acceptance and its commit, and after an outcome's commit (acknowledged or not).
A new runtime then opens the same file and the client resends every member
it has no answer for, identically.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import sqlite3
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genrm_grpc.cohort.model import Completed, Failed, Masked, Outcome, Reason, Submission
from genrm_grpc.cohort.records import Record
from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeInput
from genrm_grpc.runtime.live import REWRITE_DELAY_S, CallInterrupted
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.scoring.types import Verdict
from genrm_grpc.store.local import LocalGroups
from genrm_grpc.store.records import StoreError, decode_key
from genrm_grpc.store.sqlite import SqliteStore
from genrm_grpc.testing import ManualClock

from .support import LEASE_S, Runtime, ScriptedJudge, settle, sub

#: (group id, rollout index): one member of the script.
MemberId = tuple[str, int]
#: (group id, i, j): one judge pass (one judge per comparison, no swap).
PassId = tuple[str, int, int]
Answer = tuple[str, ...] | tuple[str, float]

_ANSWER = re.compile(r"^(\w+)/0/(\d+): ")


class HeldStore(SqliteStore):
    """A real SQLite store whose batches wait in the process until :meth:`commit`.

    ``synchronous=OFF``: a process crash is simulated here, not a power loss; what the
    writer committed is in the file either way.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, synchronous="OFF")
        self.held: list[tuple[Sequence[Record], asyncio.Future[None]]] = []
        self.dead = False
        #: The next commit fails (nothing is written): a full disk.
        self.failing = False

    def persist(self, records: Sequence[Record]) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.dead:  # a dead process writes nothing and is told nothing
            self.held.append((records, future))
        return future

    async def commit(self, *, acknowledge: bool = True) -> None:
        """One group commit of every waiting batch; ``acknowledge``: the runtime hears it."""
        held, self.held = self.held, []
        if not held:
            return
        if self.failing:
            self.failing = False
            for _, future in held:
                future.set_exception(StoreError("database or disk is full"))
            return
        written = [SqliteStore.persist(self, records) for records, _ in held]
        await asyncio.wait(written)
        if acknowledge:
            for (_, future), done in zip(held, written, strict=True):
                error = done.exception()
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        else:
            for done in written:
                done.exception()


def verdict_for(inp: JudgeInput) -> Verdict:
    """A verdict that depends only on the question (so both runs see the same ones)."""
    h = int.from_bytes(hashlib.sha256(f"{inp.response_1}|{inp.response_2}".encode()).digest()[:4])
    return Verdict(float(1 + h % 10), float(1 + (h // 10) % 10), float(1 + (h // 100) % 6))


def pass_of(inp: JudgeInput) -> PassId:
    first, second = _ANSWER.match(inp.response_1), _ANSWER.match(inp.response_2)
    assert first is not None and second is not None, inp
    assert first.group(1) == second.group(1)
    return (first.group(1), int(first.group(2)), int(second.group(2)))


def answer_of(outcome: Outcome, slot: int) -> Answer:
    if isinstance(outcome, Completed):
        return ("reward", outcome.rewards[slot].reward)
    if isinstance(outcome, Masked):
        return ("masked",)
    assert isinstance(outcome, Failed)
    return ("failed",)


@dataclass(frozen=True)
class Script:
    sizes: dict[str, int]
    schedule: str
    #: group → the rollout index whose passes as first answer the judge fails for good
    poisoned: dict[str, int]
    ops: list[tuple[object, ...]]

    def without_crashes(self) -> Script:
        """The same script with neither crashes nor hang-ups."""
        ops = [op for op in self.ops if op[0] not in ("crash", "hangup")]
        return Script(self.sizes, self.schedule, self.poisoned, ops)


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    count = draw(st.integers(1, 2))
    sizes = {f"g{n}": draw(st.integers(1, 4)) for n in range(count)}
    poisoned: dict[str, int] = {}
    for gid, size in sizes.items():
        slot = draw(st.one_of(st.none(), st.integers(0, size - 1)))
        if slot is not None:
            poisoned[gid] = slot
    members = [(gid, i) for gid, size in sizes.items() for i in range(size)]
    order = draw(st.permutations(members))
    others = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("judge"), st.integers(0, 7)),
                st.just(("commit",)),
                st.just(("fail",)),
                st.tuples(st.just("crash"), st.booleans()),
                st.tuples(st.just("hangup"), st.integers(0, 7)),
            ),
            max_size=24,
        )
    )
    # Each member's first submission goes at a drawn place among the other steps.
    ops: list[tuple[object, ...]] = list(others)
    for member in order:
        ops.insert(draw(st.integers(0, len(ops))), ("submit", member))
    schedule = draw(st.sampled_from(["after_collection", "eager"]))
    return Script(sizes, schedule, poisoned, ops)


@dataclass
class Run:
    """What a run of a script observed."""

    answers: dict[MemberId, Answer] = field(default_factory=dict)
    #: every judge call, by pass, in order
    calls: list[PassId] = field(default_factory=list)
    #: passes journaled or settled (tombstone) in the file at some crash: never judged again
    settled: set[PassId] = field(default_factory=set)
    #: pass → crashes at which it had been judged in that process but was not in the file
    lost: dict[PassId, int] = field(default_factory=dict)
    #: at each crash, the groups whose outcome was in the file
    stored: list[set[str]] = field(default_factory=list)
    crashes: int = 0


@functools.cache
def _settings(schedule: str) -> Settings:
    return Settings(
        # Far beyond the rewrites' clock steps: no deadline ever passes.
        cohort_collection_timeout_s=100_000.0,
        cohort_evaluation_timeout_s=100_000.0,
        judge_schedule=schedule,  # type: ignore[arg-type]
        judge_max_concurrency=64,
        default_principle="",
        replica_lease_s=LEASE_S,
    )


class Process:
    """One server process: the runtime over the in-process group store with the file
    behind it (every commit written there before it counts), a judge, the clients."""

    def __init__(self, script: Script, path: Path, run: Run) -> None:
        self.script = script
        self.run = run
        self.store = HeldStore(path)
        self.judge = ScriptedJudge(verdict=verdict_for)
        self.clock = ManualClock(start=1000.0)
        config = _settings(script.schedule)
        groups = LocalGroups(
            config,
            lease_s=config.replica_lease_s,
            behind=self.store,
            address=f"sqlite:///{path}",
            clock=self.clock,
        )
        self.runtime: Runtime = ReplicaRuntime(
            self.judge, config, shared=groups, clock=self.clock, batch_window_s=0.0
        )
        self.calls: list[asyncio.Task[None]] = []
        #: Calls that got STORE_UNAVAILABLE: the client sends them again.
        self.unavailable: list[MemberId] = []
        self.sent: dict[asyncio.Future[None], MemberId] = {}

    def send(self, member: MemberId) -> None:
        gid, slot = member
        submission = sub(slot, gid=gid, size=self.script.sizes[gid])
        call = asyncio.ensure_future(self._call(member, submission))
        self.calls.append(call)
        self.sent[call] = member

    async def _call(self, member: MemberId, submission: Submission) -> None:
        """What SubmitMember does: answer only once what the answer depends on is durable."""
        try:
            ticket = await self.runtime.submit(submission)
            if ticket.rejection is not None:
                self.run.answers[member] = ("rejected", ticket.rejection.reason.value)
                return
            await ticket.persisted()
            if ticket.replay is not None:
                outcome = ticket.replay.outcome
            else:
                assert ticket.waiter is not None
                outcome = await ticket.waiter.wait()
        except CallInterrupted as exc:
            if exc.reason is Reason.STORE_UNAVAILABLE:
                self.unavailable.append(member)
            else:
                self.run.answers[member] = ("interrupted", exc.reason.value)
            return
        self.run.answers[member] = answer_of(outcome, member[1])

    def hang_up(self, pick: int) -> None:
        """A client drops a call still waiting (its connection), and sends it again."""
        waiting = [(call, member) for call, member in self.sent.items() if not call.done()]
        if waiting:
            call, member = waiting[pick % len(waiting)]
            call.cancel()
            self.unavailable.append(member)

    def judge_one(self, pick: int) -> bool:
        blocked = self.judge.blocked()
        if not blocked:
            return False
        call = blocked[pick % len(blocked)]
        gid, i, _ = pass_of(call.inp)
        if self.script.poisoned.get(gid) == i:
            call.fail()
        else:
            call.release()
        return True

    def record_calls(self) -> list[PassId]:
        return [pass_of(call.inp) for call in self.judge.calls]

    async def stop(self, *, silent_commit: bool = False) -> None:
        """The process dies: see the module docstring."""
        if silent_commit:
            await self.store.commit(acknowledge=False)
        self.store.dead = True
        self.store.held.clear()
        for call in self.calls:
            call.cancel()
        await asyncio.gather(*self.calls, return_exceptions=True)
        # Its drain, with nothing reaching the file any more: what it does then is this
        # process's memory only, which the crash throws away.
        await self.runtime.shutdown(0)
        await self.runtime.close()


def in_file(path: Path) -> tuple[set[PassId], set[str]]:
    """(journaled passes, groups with a tombstone) as the file holds them."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        passes = {
            (decode_key(key).group_id or "", i, j)
            for key, i, j in conn.execute("SELECT cohort, response_i, response_j FROM verdicts")
        }
        tombs = {
            decode_key(key).group_id or "" for (key,) in conn.execute("SELECT key FROM tombstones")
        }
    return passes, tombs


async def execute(script: Script, path: Path) -> Run:
    run = Run()
    process = Process(script, path, run)
    await process.runtime.open()
    sent: list[MemberId] = []

    async def crash(silent: bool) -> Process:
        await process.stop(silent_commit=silent)
        run.crashes += 1
        made = process.record_calls()
        run.calls.extend(made)
        journaled, tombs = in_file(path)
        run.stored.append(tombs)
        done = journaled | {p for p in made if p[0] in tombs}
        for member, answer in run.answers.items():
            # Nothing was answered that the file does not hold.
            assert member[0] in tombs or answer[0] == "rejected", (member, answer)
        for judged in set(made) - done:
            run.lost[judged] = run.lost.get(judged, 0) + 1
        run.settled |= journaled
        run.settled |= {p for p in run.calls if p[0] in tombs}
        fresh = Process(script, path, run)
        await fresh.runtime.open()
        for member in sent:
            if member not in run.answers:
                fresh.send(member)  # the client's identical resend
        await settle(100)
        return fresh

    async def resend_unavailable() -> None:
        retry, process.unavailable = process.unavailable, []
        for member in retry:
            process.send(member)  # the client's identical resend after UNAVAILABLE
        if retry:
            await settle(100)

    for op in script.ops:
        if op[0] == "submit":
            member = op[1]
            assert isinstance(member, tuple)
            sent.append(member)
            process.send(member)
        elif op[0] == "judge":
            process.judge_one(int(op[1]))  # type: ignore[call-overload]
        elif op[0] == "commit":
            await process.store.commit()
        elif op[0] == "hangup":
            process.hang_up(int(op[1]))  # type: ignore[call-overload]
        elif op[0] == "fail":
            process.store.failing = True
            await process.store.commit()
        else:
            process = await crash(bool(op[1]))
            continue
        await settle(100)
        await resend_unavailable()

    # Let the run finish: commit and judge until every member has its answer.
    for _ in range(200):
        if len(run.answers) == len(sent):
            break
        process.clock.advance(REWRITE_DELAY_S)  # the rewrites of failed outcome writes
        await settle(20)
        await process.store.commit()
        while process.judge_one(0):
            await settle(20)
        await settle(100)
        await resend_unavailable()
    assert len(run.answers) == len(sent), (run.answers, sent)
    await process.stop()
    run.calls.extend(process.record_calls())
    _, tombs = in_file(path)
    assert {gid for gid, _ in run.answers} <= tombs
    return run


def run_script(script: Script) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(execute(script, Path(tmp) / "state.sqlite3"))


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(script=scripts())
def test_crashes_anywhere_never_change_an_outcome_nor_judge_a_finished_pass_twice(
    script: Script,
) -> None:
    calm = run_script(script.without_crashes())
    crashed = run_script(script)

    assert crashed.answers == calm.answers
    assert all(answer[0] in ("reward", "masked") for answer in calm.answers.values())
    # Without crashes every pass is judged at most once.
    assert len(calm.calls) == len(set(calm.calls))
    # A pass journaled (or whose cohort's outcome was stored) before a crash is never
    # judged after it; a pass is judged again only after crashes that caught it unjournaled.
    for judged in set(crashed.calls):
        assert crashed.calls.count(judged) <= 1 + crashed.lost.get(judged, 0), judged
    # In total: the crash-free run's calls plus the passes in flight at each crash
    # (groups whose judge fails may stop judging at different points in the two runs).
    sound = {gid for gid in script.sizes if gid not in script.poisoned}
    calm_sound = [p for p in calm.calls if p[0] in sound]
    crashed_sound = [p for p in crashed.calls if p[0] in sound]
    lost_sound = sum(n for p, n in crashed.lost.items() if p[0] in sound)
    assert len(crashed_sound) <= len(calm_sound) + lost_sound


def _pair_script(*steps: tuple[object, ...]) -> Script:
    members = [("submit", ("g0", 0)), ("submit", ("g0", 1))]
    return Script({"g0": 2}, "after_collection", {}, [*members, *steps])


def test_the_crash_model_loses_what_was_not_committed_and_keeps_what_was() -> None:
    """The model itself, on a group of two (passes (0, 1) and (1, 0)). The runtime
    decides the second member once the first one's commit is written (the group's
    reads wait for it): two ``commit`` steps store both members."""
    members = (("commit",), ("commit",))
    # Nothing committed: judging waits for the members' records, so the crash loses the
    # members (they are resent) but no judge call; each pass is judged once.
    run = run_script(_pair_script(("judge", 0), ("crash", False)))
    assert run.crashes == 1 and run.settled == set() and run.stored == [set()]
    assert run.lost == {}
    assert sorted(run.calls) == [("g0", 0, 1), ("g0", 1, 0)]
    # A journal commit between the judge completion and the crash: only the other pass.
    run = run_script(_pair_script(*members, ("judge", 0), ("commit",), ("crash", False)))
    assert run.settled == {("g0", 0, 1)} and run.lost == {("g0", 1, 0): 1}
    assert sorted(run.calls) == [("g0", 0, 1), ("g0", 1, 0), ("g0", 1, 0)]
    # Both verdicts journaled. The runtime commits the outcome once they are written, so
    # the crash loses its batch, and the next process concludes from the journal. No
    # judge call again.
    both_judged = (*members, ("judge", 0), ("judge", 0), ("commit",))
    run = run_script(_pair_script(*both_judged, ("crash", False)))
    assert run.stored == [set()]
    assert run.settled == {("g0", 0, 1), ("g0", 1, 0)}
    assert run.lost == {} and sorted(run.calls) == [("g0", 0, 1), ("g0", 1, 0)]
    # The outcome committed but never acknowledged: it is in the file, the resends
    # replay it.
    run = run_script(_pair_script(*both_judged, ("crash", True)))
    assert run.stored == [{"g0"}]
    assert run.lost == {} and sorted(run.calls) == [("g0", 0, 1), ("g0", 1, 0)]
    assert {answer[0] for answer in run.answers.values()} == {"reward"}
