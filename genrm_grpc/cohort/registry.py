"""The cohort registry: every rule of the member-submission table
(docs/protocol.md), sans I/O.

The registry takes events — a member arrived, a deadline passed, an evaluation
finished, the server is draining — and returns decisions. It never sleeps, never
awaits and never reads a clock: the caller passes ``now``. The asyncio runtime
executes the decisions (waiters, timers, judge tasks).

Cost per event is O(1) amortised in the number of retained cohorts: lookups are
dict lookups, and retention evicts from the old end of insertion-ordered stores.

The rules are here; what a decision is, every refusal's wording and the outcomes of a
cohort that ends without rewards are in ``cohort/decisions.py`` (``Disposition``,
``SubmitDecision``, ``Ended``, ``failure_rejection`` and ``legacy_outcome`` re-exported
here); the active cohorts' indexes in ``cohort/active.py``; which records a cohort
becomes, and the cohort rebuilt from them, in ``cohort/recording.py``. What is left,
about 520 lines, stays one module on purpose: every event below reads and changes
the same state (the active cohorts, the outbox of records, the retained store), and
together they are the one status table; cut further, a rule would be read across two
files.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Protocol

from genrm_grpc.cohort.active import ActiveCohorts
from genrm_grpc.cohort.decisions import (
    Disposition,
    Ended,
    SubmitDecision,
    capacity_exhausted,
    closed,
    collection_expired,
    evaluation_expired,
    failure_rejection,
    legacy_outcome,
    mismatch,
    principal_quota_exhausted,
    refuse,
    shutting_down,
    slot_conflict,
    terminal_decision,
)
from genrm_grpc.cohort.model import (
    ANONYMOUS,
    Cohort,
    CohortKey,
    Completed,
    Failed,
    Masked,
    Member,
    Outcome,
    Phase,
    Reason,
    Submission,
    Tombstone,
    clip_reason,
    group_scope,
    reward_problem,
)
from genrm_grpc.cohort.phases import Event, allows, transition
from genrm_grpc.cohort.recording import (
    Deferred,
    cohort_record,
    end_state,
    member_record,
    restored_cohort,
    tombstone_of,
)
from genrm_grpc.cohort.records import (
    CohortStore,
    DropCohort,
    DropTombstone,
    DropWatermark,
    Record,
    Recovered,
    TombstoneRecord,
    WatermarkRecord,
)

__all__ = [
    "CohortRegistry",
    "Disposition",
    "Ended",
    "RegistryView",
    "SubmitDecision",
    "failure_rejection",
    "fill",
    "legacy_outcome",
]

log = logging.getLogger(__name__)


class RegistryView(Protocol):
    """The settings the registry reads (a scoped view; ``Settings`` satisfies it).

    Names, defaults and validation live once, in ``genrm_grpc.config.Settings``.
    """

    @property
    def cohort_collection_timeout_s(self) -> float: ...
    @property
    def cohort_evaluation_timeout_s(self) -> float: ...
    @property
    def cohort_result_ttl_s(self) -> float: ...
    @property
    def max_active_cohorts(self) -> int: ...
    #: Active cohorts one principal may hold (None: only ``max_active_cohorts`` applies).
    @property
    def max_active_cohorts_per_principal(self) -> int | None: ...


def fill(cohort: Cohort, evaluation_deadline: float | None) -> None:
    """The cohort has every member: it is frozen as it is and evaluated next.

    The one place a cohort enters EVALUATING (a last member, a restored header that was
    filled before the restart, a Compare call's ready-made group), through the table.
    A Compare group has no evaluation deadline (None): its call's own deadline bounds it.
    """
    cohort.phase = transition(cohort.phase, Event.FILLED)
    cohort.snapshot = tuple(cohort.members[i] for i in range(cohort.group_size))
    cohort.evaluation_deadline = evaluation_deadline


class CohortRegistry:
    """Owns every active cohort and decides what each event means.

    Each event returns a decision that carries everything the runtime must do: the
    cohorts to publish, and the records (see ``genrm_grpc.cohort.records``) that make
    the change durable, which the runtime persists before it answers anyone who
    depends on them. Record times are wall-clock: ``wall_offset`` (wall minus the
    ``now`` the caller passes) is set by the runtime.
    """

    def __init__(self, config: RegistryView, store: CohortStore) -> None:
        self.config = config
        self.store = store
        self._active = ActiveCohorts()
        self._seq = 0
        self._draining = False
        self._warned_missing_attempt = False
        self.evictions_examined = 0
        self.wall_offset = 0.0
        #: Keep every record in the outbox until :meth:`take_records`, as the end state
        #: of them all (``recording.end_state``), each decision's ``records`` empty: a
        #: one-group registry's round is committed at once, and a header that a later
        #: decision of the round undoes (a cohort created and ended) is never made.
        self.defer_records = False
        self._outbox: list[Deferred] = []
        store.on_evict = _evictions_of(self)

    # ------------------------------------------------------------------ queries
    @property
    def draining(self) -> bool:
        return self._draining

    def active_count(self) -> int:
        return len(self._active)

    def active(self, key: CohortKey) -> Cohort | None:
        return self._active.get(key)

    def active_cohorts(self) -> list[Cohort]:
        return self._active.cohorts()

    def latest_attempt(self, group_id: str, now: float, principal: str = ANONYMOUS) -> int | None:
        return self.store.watermark(group_scope(principal, group_id), now)

    def lookup(self, key: CohortKey, now: float) -> Cohort | Tombstone | None:
        """The active cohort or the retained tombstone under ``key`` (GetCohort)."""
        cohort = self._active.get(key)
        return cohort if cohort is not None else self.store.tombstone(key, now)

    def counts(self) -> dict[str, int]:
        """Sizes of what the registry holds (metrics, leak checks)."""
        return {"active": len(self._active), **self.store.counts()}

    def count_elsewhere(self, total: int, by_principal: Mapping[str, int]) -> None:
        """Active cohorts that count against the capacity limits but are not held here.

        Replicas sharing a store decide about one group at a time in a registry that
        holds only that group; the rest of the deployment's active cohorts are counted
        here so that ``max_active_cohorts`` and the per-principal quota keep their meaning.
        """
        self._active.count_elsewhere(total, by_principal)

    # ------------------------------------------------------------------ events
    def submit(self, sub: Submission, now: float) -> SubmitDecision:
        """Decide what a member submission gets (the status table of docs/protocol.md)."""
        decision = self._submit(sub, now)
        decision.records = self._take()
        return decision

    def _submit(self, sub: Submission, now: float) -> SubmitDecision:
        self._sweep(now)
        if sub.coords.group_id is not None and sub.coords.group_attempt is None:
            self._warn_missing_attempt(sub)
        ended: list[Cohort] = []
        key = sub.key
        scope = key.group_scope
        follows = False
        if key.group_id is not None and scope is not None:
            latest = self.store.watermark(scope, now)
            if latest is not None and key.attempt < latest:
                return refuse(
                    Reason.ATTEMPT_SUPERSEDED,
                    f"group {key.group_id!r} attempt {key.attempt} was superseded by attempt "
                    f"{latest}; results of old attempts are never published",
                    sub,
                    latestAttempt=str(latest),
                )
            if latest is None or key.attempt > latest:
                # A new attempt of a known group must answer the same prompt at the same
                # size; it is checked (and capacity too) before it supersedes anything.
                reference = self._group_reference(key, latest, now)
                if reference is not None and (
                    reference.prompt_digest != sub.prompt_digest
                    or reference.group_size != sub.group_size
                ):
                    return mismatch(sub, reference.group_size, reference.prompt_digest)
                if self._active.get(key) is None:
                    older = len(self._active.attempts(scope))
                    refusal = self._new_cohort_refusal(sub, superseded=older)
                    if refusal is not None:
                        return refusal
                follows = latest is not None
                ended = self._supersede(key, now)
                self._raise_watermark(scope, key.attempt, now)

        cohort = self._active.get(key)
        if (
            cohort is not None
            and allows(cohort.phase, Event.COLLECTION_EXPIRED)
            and now >= cohort.collection_deadline
        ):
            # The deadline has passed but its timer has not run yet: it wins, exactly once.
            self._end_collection(cohort, now)
            ended.append(cohort)
            cohort = None
        if cohort is not None:
            decision = self._submit_active(cohort, sub, now)
        else:
            decision = self._submit_inactive(sub, now, follows=follows)
        decision.ended[:0] = ended
        return decision

    def collection_deadline(self, cohort: Cohort, now: float) -> Ended | None:
        """The collection timer fired: the cohort fails (late timers change nothing)."""
        if not allows(cohort.phase, Event.COLLECTION_EXPIRED) or now < cohort.collection_deadline:
            return None
        self._end_collection(cohort, now)
        return self._ended(cohort)

    def _end_collection(self, cohort: Cohort, now: float) -> None:
        failed = collection_expired(cohort, self.config.cohort_collection_timeout_s)
        self._end(cohort, Event.COLLECTION_EXPIRED, failed, now)

    def evaluation_deadline(self, cohort: Cohort, now: float) -> Ended | None:
        """The evaluation timer fired: the judge did not finish in time → masked result."""
        if (
            not allows(cohort.phase, Event.EVALUATION_EXPIRED)
            or cohort.evaluation_deadline is None
            or now < cohort.evaluation_deadline
        ):
            return None
        masked = evaluation_expired(self.config.cohort_evaluation_timeout_s)
        self._end(cohort, Event.EVALUATION_EXPIRED, masked, now)
        return self._ended(cohort)

    def evaluation_finished(self, cohort: Cohort, outcome: Completed, now: float) -> Ended | None:
        """Every pass was judged and aggregated. None (discarded) unless the cohort waits."""
        if not self._waits_for_judge(cohort):
            return None
        problem = reward_problem(outcome.rewards, cohort.group_size)
        if problem is not None:
            return self.aggregation_failed(cohort, problem, now)
        self._end(cohort, Event.JUDGED, outcome, now)
        return self._ended(cohort)

    def judge_failed(
        self, cohort: Cohort, reason: str, now: float, *, reused: int = 0, resumed: int = 0
    ) -> Ended | None:
        """A judge pass failed for good: the cohort completes *masked* (no reward made up)."""
        if not self._waits_for_judge(cohort):
            return None
        masked = Masked(clip_reason(reason), passes_reused=reused, passes_resumed=resumed)
        self._end(cohort, Event.JUDGE_FAILED, masked, now)
        return self._ended(cohort)

    def aggregation_failed(self, cohort: Cohort, reason: str, now: float) -> Ended | None:
        """The verdicts could not be turned into rewards: the cohort fails, nothing is published."""
        if not self._waits_for_judge(cohort):
            return None
        failed = Failed(clip_reason(reason), legacy=not cohort.key.explicit)
        self._end(cohort, Event.AGGREGATION_FAILED, failed, now)
        return self._ended(cohort)

    def fail(self, cohort: Cohort, reason: str, now: float) -> Ended | None:
        """Fail an active cohort (operator cancellation, shutdown without a durable store)."""
        if not cohort.active or self._active.get(cohort.key) is not cohort:
            return None
        failed = Failed(clip_reason(reason), legacy=not cohort.key.explicit)
        self._end(cohort, Event.CANCELLED, failed, now)
        return self._ended(cohort)

    def start_draining(self) -> None:
        self._draining = True

    def restore(self, recovered: Recovered, now: float) -> list[Cohort]:
        """Take back what a store held at start-up; returns the active cohorts, oldest first.

        Wall-clock instants become ``now``-based ones through ``wall_offset``, so time
        spent down counts against every deadline and retention period.
        """
        offset = self.wall_offset
        for mark in recovered.watermarks:
            self.store.raise_watermark(mark.scope, mark.attempt, now, mark.expires_at - offset)
        for tomb in recovered.tombstones:
            self.store.put_tombstone(tomb.tombstone, now, tomb.expires_at - offset)
        restored: list[Cohort] = []
        for entry in recovered.cohorts:
            head = entry.header
            cohort = restored_cohort(entry, offset)
            if head.phase is Phase.EVALUATING and cohort.full:
                # Filled before the restart: the same transition, at the stored deadline.
                deadline = head.evaluation_deadline
                fill(
                    cohort,
                    now + self.config.cohort_evaluation_timeout_s
                    if deadline is None
                    else deadline - offset,
                )
            self._seq = max(self._seq, head.seq)
            self._active.add(cohort)
            scope = cohort.key.group_scope
            if scope is not None:
                self.store.raise_watermark(scope, cohort.key.attempt, now)
            restored.append(cohort)
        self._outbox.clear()  # restoring writes nothing back
        return restored

    def _submit_active(self, cohort: Cohort, sub: Submission, now: float) -> SubmitDecision:
        if cohort.prompt_digest != sub.prompt_digest or cohort.group_size != sub.group_size:
            return mismatch(sub, cohort.group_size, cohort.prompt_digest)
        member = cohort.members.get(sub.rollout_index)
        if member is not None:
            if member.candidate.digest == sub.candidate.digest:
                return SubmitDecision(Disposition.ATTACHED, cohort=cohort)
            return slot_conflict(sub)
        if not allows(cohort.phase, Event.JOINED):
            return closed(sub, cohort.phase)
        if self._draining:
            return shutting_down(sub)
        return self._accept(cohort, sub, now)

    def _submit_inactive(self, sub: Submission, now: float, *, follows: bool) -> SubmitDecision:
        tomb = self.store.tombstone(sub.key, now)
        if tomb is not None:
            return terminal_decision(tomb, sub)
        refusal = self._new_cohort_refusal(sub, superseded=0)
        if refusal is not None:
            return refusal
        self._seq += 1
        cohort = Cohort(
            key=sub.key,
            seq=self._seq,
            group_size=sub.group_size,
            prompt=sub.prompt,
            prompt_digest=sub.prompt_digest,
            created_at=now,
            collection_deadline=now + self.config.cohort_collection_timeout_s,
            follows_attempt=follows,
        )
        self._active.add(cohort)
        self._header(cohort)
        return self._accept(cohort, sub, now)

    def _accept(self, cohort: Cohort, sub: Submission, now: float) -> SubmitDecision:
        member = Member(coords=sub.coords, candidate=sub.candidate)
        cohort.members[sub.rollout_index] = member
        self._outbox.append(member_record(cohort.key, member))
        frozen = False
        if not cohort.full:
            cohort.phase = transition(cohort.phase, Event.JOINED)
        else:
            fill(cohort, now + self.config.cohort_evaluation_timeout_s)
            self._header(cohort)
            frozen = True
        return SubmitDecision(Disposition.ACCEPTED, cohort=cohort, frozen=frozen)

    def _raise_watermark(self, scope: str, attempt: int, now: float) -> None:
        self.store.raise_watermark(scope, attempt, now)
        expires = now + self.config.cohort_result_ttl_s + self.wall_offset
        self._outbox.append(WatermarkRecord(scope, attempt, expires))

    def _header(self, cohort: Cohort) -> None:
        """Write the cohort's header as it is now (deferred: as it is when taken)."""
        if self.defer_records:
            self._outbox.append(cohort)
        else:
            self._outbox.append(cohort_record(cohort, self.wall_offset))

    def _take(self) -> list[Record]:
        if self.defer_records:
            return []
        records, self._outbox = self._outbox, []
        return records  # type: ignore[return-value]  # no header is deferred

    def take_records(self) -> list[Record]:
        """Every record since the last take, as their end state (``defer_records``)."""
        entries, self._outbox = self._outbox, []
        if not entries:
            return []
        return end_state(entries, self.wall_offset)

    def _ended(self, cohort: Cohort) -> Ended:
        return Ended([cohort], self._take())

    def _evicted(self, kind: str, key: CohortKey | str) -> None:
        """The store dropped a retained record: drop it from the durable store too."""
        if isinstance(key, CohortKey):
            self._outbox.append(DropTombstone(key))
        else:
            self._outbox.append(DropWatermark(key))

    def _waits_for_judge(self, cohort: Cohort) -> bool:
        return allows(cohort.phase, Event.JUDGED) and self._active.get(cohort.key) is cohort

    def _supersede(self, key: CohortKey, now: float) -> list[Cohort]:
        group_id, attempt = key.group_id, key.attempt
        scope = key.group_scope
        ended = [c for old, c in self._active.attempts(scope).items() if old < attempt]
        for cohort in ended:
            failed = Failed(f"superseded by attempt {attempt} of group {group_id!r}")
            self._end(cohort, Event.SUPERSEDED, failed, now)
        return ended

    def _group_reference(
        self, key: CohortKey, latest: int | None, now: float
    ) -> Cohort | Tombstone | None:
        """An active or the newest terminal cohort of the group, to compare prompts with."""
        scope = key.group_scope
        attempts = self._active.attempts(scope)
        if attempts:
            return next(iter(attempts.values()))
        if latest is None:
            return None
        return self.store.tombstone(CohortKey(key.group_id, None, latest, key.principal), now)

    def _end(self, cohort: Cohort, event: Event, outcome: Outcome, now: float) -> None:
        """Make a cohort terminal: record its outcome, leave a tombstone, drop its bodies."""
        cohort.phase = transition(cohort.phase, event)
        self._active.remove(cohort)
        gid = cohort.key.group_scope
        if gid is not None:
            self._raise_watermark(gid, cohort.key.attempt, now)
        digests = {i: m.candidate.digest for i, m in cohort.members.items()}
        # Explicit cohorts keep a tombstone for replay and fencing. Legacy cohorts are
        # retired on success; a failed legacy key — failed, or masked because the judge
        # failed — stays fenced, so that neither a resend nor a delayed member of the
        # failed run can start a new cohort that mixes runs or is judged again.
        keep = cohort.key.explicit or not isinstance(outcome, Completed)
        if not cohort.key.explicit and not isinstance(outcome, Completed):
            outcome = legacy_outcome(outcome)
        cohort.outcome = outcome
        # The cohort's records go; its journaled verdicts stay while its tombstone does.
        self._outbox.append(DropCohort(cohort.key, keep_verdicts=keep))
        if keep:
            tomb = tombstone_of(cohort, digests, outcome, now + self.wall_offset)
            expires = now + self.config.cohort_result_ttl_s + self.wall_offset
            self._outbox.append(TombstoneRecord(tomb, expires))
            self.store.put_tombstone(tomb, now)
        cohort.members = {}
        cohort.snapshot = None

    def _sweep(self, now: float) -> None:
        self.evictions_examined += self.store.evict(now, self._active.has_group)

    def _warn_missing_attempt(self, sub: Submission) -> None:
        if not self._warned_missing_attempt:
            self._warned_missing_attempt = True
            log.warning(
                "member of group %r has no group_attempt; treating it as attempt 0. "
                "Send group_attempt explicitly and increase it when you regenerate a group.",
                sub.coords.group_id,
            )

    def _new_cohort_refusal(self, sub: Submission, *, superseded: int) -> SubmitDecision | None:
        """Why ``sub`` may not open a cohort now, or None: draining, then the deployment's
        ``max_active_cohorts``, then its principal's share. ``superseded`` cohorts of its
        group end if it opens, so they do not count against it. The one place these
        bounds are decided (a replica's registry sees the deployment's counts)."""
        if self._draining:
            return shutting_down(sub)
        limit = self.config.max_active_cohorts
        if self._active.total() - superseded >= limit:
            return capacity_exhausted(sub, limit)
        quota = self.config.max_active_cohorts_per_principal
        if quota is not None and self._active.held_by(sub.key.principal) - superseded >= quota:
            return principal_quota_exhausted(sub, quota)
        return None


def _evictions_of(registry: CohortRegistry) -> Callable[[str, CohortKey | str], None]:
    """The store's eviction callback, holding ``registry`` weakly: a registry and its
    store form no reference cycle, so a one-group registry (a decision's) is freed as
    soon as it is dropped, not by a pass of the cyclic garbage collector."""
    method = weakref.WeakMethod(registry._evicted)

    def evicted(kind: str, key: CohortKey | str) -> None:
        bound = method()
        if bound is not None:
            bound(kind, key)

    return evicted
