"""The cohort registry: every rule of the member-submission table
(docs/protocol.md), sans I/O.

The registry takes events — a member arrived, a deadline passed, an evaluation
finished, the server is draining — and returns decisions. It never sleeps, never
awaits and never reads a clock: the caller passes ``now``. The asyncio runtime
executes the decisions (waiters, timers, judge tasks).

Cost per event is O(1) amortised in the number of retained cohorts: lookups are
dict lookups, and retention evicts from the old end of insertion-ordered stores.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from genrm_grpc.cohort.identity import coords_metadata
from genrm_grpc.cohort.model import (
    ANONYMOUS,
    LEGACY_RETRY_ADVICE,
    MAX_FAILURE_REASON,
    CandidateSpec,
    Cohort,
    CohortKey,
    Completed,
    Failed,
    Masked,
    Member,
    Outcome,
    Phase,
    Reason,
    Rejection,
    Submission,
    Tombstone,
    clip,
    clip_reason,
    group_scope,
    reward_problem,
)
from genrm_grpc.cohort.phases import Event, allows, transition
from genrm_grpc.cohort.records import (
    CohortRecord,
    CohortStore,
    DropCohort,
    DropTombstone,
    DropWatermark,
    MemberRecord,
    Record,
    Recovered,
    TombstoneRecord,
    WatermarkRecord,
)

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


class Disposition(enum.Enum):
    ACCEPTED = "accepted"  # new slot filled
    ATTACHED = "attached"  # identical resubmission of an active member
    REPLAYED = "replayed"  # identical resubmission after completion
    REJECTED = "rejected"


@dataclass(slots=True)
class SubmitDecision:
    disposition: Disposition
    cohort: Cohort | None = None
    rejection: Rejection | None = None
    replay: Tombstone | None = None
    #: True when this member filled the last slot: the cohort is now evaluating.
    frozen: bool = False
    #: Cohorts that this submission ended (older attempts it superseded, or its own
    #: cohort when the collection deadline had already passed). Publish their outcomes.
    ended: list[Cohort] = field(default_factory=list)
    #: What the decision changed, to persist before any answer that depends on it.
    records: list[Record] = field(default_factory=list)


class Ended(list[Cohort]):
    """Cohorts an event ended (publish their outcomes) and the records to persist first.

    Empty — and so false — when the event changed nothing (a late timer, a stale result).
    """

    def __init__(self, cohorts: list[Cohort], records: list[Record]) -> None:
        super().__init__(cohorts)
        self.records = records


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
        self._active: dict[CohortKey, Cohort] = {}
        # group scope (principal + group_id) → attempts with an active cohort; makes
        # supersession O(attempts).
        self._active_by_group: dict[str, dict[int, Cohort]] = {}
        self._active_by_principal: dict[str, int] = {}
        self._seq = 0
        self._draining = False
        self._warned_missing_attempt = False
        self.evictions_examined = 0
        self.wall_offset = 0.0
        #: Emit the records of active cohorts (headers, members, attempt watermarks).
        #: A store that keeps nothing across a restart needs only what ends a cohort
        #: (its tombstone and the drops): the runtime sets this from the store.
        self.journal_active = True
        self._outbox: list[Record] = []
        # Active cohorts held outside this registry (replicas: the rest of the deployment).
        self._elsewhere = 0
        self._elsewhere_by_principal: dict[str, int] = {}
        store.on_evict = self._evicted

    # ------------------------------------------------------------------ queries
    @property
    def draining(self) -> bool:
        return self._draining

    def active_count(self) -> int:
        return len(self._active)

    def active(self, key: CohortKey) -> Cohort | None:
        return self._active.get(key)

    def active_cohorts(self) -> list[Cohort]:
        return list(self._active.values())

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
        self._elsewhere = total
        self._elsewhere_by_principal = dict(by_principal)

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
                return self._reject(
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
                    return self._mismatch(sub, reference.group_size, reference.prompt_digest)
                if self._active.get(key) is None:
                    older = len(self._active_by_group.get(scope, ()))
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
            self._end(cohort, Event.COLLECTION_EXPIRED, self._collection_expired(cohort), now)
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
        self._end(cohort, Event.COLLECTION_EXPIRED, self._collection_expired(cohort), now)
        return self._ended(cohort)

    def evaluation_deadline(self, cohort: Cohort, now: float) -> Ended | None:
        """The evaluation timer fired: the judge did not finish in time → masked result."""
        if (
            not allows(cohort.phase, Event.EVALUATION_EXPIRED)
            or cohort.evaluation_deadline is None
            or now < cohort.evaluation_deadline
        ):
            return None
        reason = (
            f"judge evaluation deadline expired: cohort_evaluation_timeout_s="
            f"{self.config.cohort_evaluation_timeout_s:g} passed before every comparison finished"
        )
        self._end(cohort, Event.EVALUATION_EXPIRED, Masked(reason=clip_reason(reason)), now)
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

    def fail_all(self, reason: str, now: float) -> Ended:
        ended = list(self._active.values())
        for cohort in ended:
            failed = Failed(clip_reason(reason), legacy=not cohort.key.explicit)
            self._end(cohort, Event.CANCELLED, failed, now)
        return Ended(ended, self._take())

    def suspend_all(self) -> list[Cohort]:
        """Forget every active cohort in this process, leaving it as it is in the store.

        A drain with a durable store: the next process resumes these cohorts from their
        records, so nothing is failed and nothing is written.
        """
        suspended = list(self._active.values())
        self._active.clear()
        self._active_by_group.clear()
        self._active_by_principal.clear()
        return suspended

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
            members = {
                m.coords.rollout_index: Member(m.coords, CandidateSpec(m.texts, m.digest))
                for m in entry.members
            }
            cohort = Cohort(
                key=head.key,
                seq=head.seq,
                group_size=head.group_size,
                prompt=head.prompt,
                prompt_digest=head.prompt_digest,
                created_at=head.created_at - offset,
                collection_deadline=head.collection_deadline - offset,
                members=members,
                follows_attempt=head.follows_attempt,
            )
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
            self._index(cohort)
            scope = cohort.key.group_scope
            if scope is not None:
                self.store.raise_watermark(scope, cohort.key.attempt, now)
            restored.append(cohort)
        self._outbox.clear()  # restoring writes nothing back
        return restored

    def _submit_active(self, cohort: Cohort, sub: Submission, now: float) -> SubmitDecision:
        if cohort.prompt_digest != sub.prompt_digest or cohort.group_size != sub.group_size:
            return self._mismatch(sub, cohort.group_size, cohort.prompt_digest)
        member = cohort.members.get(sub.rollout_index)
        if member is not None:
            if member.candidate.digest == sub.candidate.digest:
                return SubmitDecision(Disposition.ATTACHED, cohort=cohort)
            return self._slot_conflict(sub)
        if not allows(cohort.phase, Event.JOINED):
            return self._closed(sub, cohort.phase)
        if self._draining:
            return self._shutting_down(sub)
        return self._accept(cohort, sub, now)

    def _submit_inactive(self, sub: Submission, now: float, *, follows: bool) -> SubmitDecision:
        tomb = self.store.tombstone(sub.key, now)
        if tomb is not None:
            return self._submit_terminal(tomb, sub)
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
        self._index(cohort)
        if self.journal_active:
            self._outbox.append(self._header(cohort))
        return self._accept(cohort, sub, now)

    def _index(self, cohort: Cohort) -> None:
        key = cohort.key
        self._active[key] = cohort
        principal = key.principal
        self._active_by_principal[principal] = self._active_by_principal.get(principal, 0) + 1
        scope = key.group_scope
        if scope is not None:
            self._active_by_group.setdefault(scope, {})[key.attempt] = cohort

    def _submit_terminal(self, tomb: Tombstone, sub: Submission) -> SubmitDecision:
        if tomb.prompt_digest != sub.prompt_digest or tomb.group_size != sub.group_size:
            return self._mismatch(sub, tomb.group_size, tomb.prompt_digest)
        if not tomb.key.explicit and tomb.masked:
            # A fenced legacy key: every later member for it, whatever its answer, gets
            # the recorded masked result (whose reason advises a fresh group_id). No
            # judge call, and no new cohort that could mix a delayed member of the
            # failed run with its replacement.
            return SubmitDecision(Disposition.REPLAYED, replay=tomb)
        digest = tomb.digest_at(sub.rollout_index)
        if digest is not None and digest != sub.candidate.digest:
            return self._slot_conflict(sub)
        failed = tomb.failed
        if failed is not None:
            return self._failed(sub, failed)
        if digest is None:
            return self._closed(sub, Phase.COMPLETED)
        return SubmitDecision(Disposition.REPLAYED, replay=tomb)

    def _accept(self, cohort: Cohort, sub: Submission, now: float) -> SubmitDecision:
        member = Member(coords=sub.coords, candidate=sub.candidate)
        cohort.members[sub.rollout_index] = member
        journal = self.journal_active
        if journal:
            self._outbox.append(_member_record(cohort.key, member))
        frozen = False
        if not cohort.full:
            cohort.phase = transition(cohort.phase, Event.JOINED)
        else:
            fill(cohort, now + self.config.cohort_evaluation_timeout_s)
            if journal:
                self._outbox.append(self._header(cohort))
            frozen = True
        return SubmitDecision(Disposition.ACCEPTED, cohort=cohort, frozen=frozen)

    def _header(self, cohort: Cohort) -> CohortRecord:
        offset = self.wall_offset
        deadline = cohort.evaluation_deadline
        return CohortRecord(
            key=cohort.key,
            seq=cohort.seq,
            group_size=cohort.group_size,
            prompt=cohort.prompt,
            prompt_digest=cohort.prompt_digest,
            phase=cohort.phase,
            created_at=cohort.created_at + offset,
            collection_deadline=cohort.collection_deadline + offset,
            evaluation_deadline=None if deadline is None else deadline + offset,
            follows_attempt=cohort.follows_attempt,
        )

    def _raise_watermark(self, scope: str, attempt: int, now: float) -> None:
        self.store.raise_watermark(scope, attempt, now)
        if self.journal_active:
            expires = now + self.config.cohort_result_ttl_s + self.wall_offset
            self._outbox.append(WatermarkRecord(scope, attempt, expires))

    def final_records(self, cohort: Cohort) -> list[Record]:
        """The records that ended ``cohort`` again (to rewrite them after a failed write)."""
        key = cohort.key
        tomb = self.store.tombstone(key, -math.inf)
        records: list[Record] = [DropCohort(key, keep_verdicts=tomb is not None)]
        if tomb is not None:
            expires = tomb.finished_at + self.config.cohort_result_ttl_s
            records.append(TombstoneRecord(tomb, expires))
        scope = key.group_scope
        if scope is not None:
            attempt = self.store.watermark(scope, -math.inf)
            if attempt is not None:
                expires = tomb.finished_at if tomb is not None else self.wall_offset
                records.append(
                    WatermarkRecord(scope, attempt, expires + self.config.cohort_result_ttl_s)
                )
        return records

    def active_records(self, cohort: Cohort) -> list[Record]:
        """An active cohort's header and members as records (to write them again after a
        failed write, when a member is resent)."""
        members = (_member_record(cohort.key, m) for m in cohort.members.values())
        return [self._header(cohort), *members]

    def _take(self) -> list[Record]:
        records, self._outbox = self._outbox, []
        return records

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
        older = self._active_by_group.get(scope) if scope is not None else None
        if not older:
            return []
        ended = []
        for old_attempt, cohort in list(older.items()):
            if old_attempt < attempt:
                self._end(
                    cohort,
                    Event.SUPERSEDED,
                    Failed(f"superseded by attempt {attempt} of group {group_id!r}"),
                    now,
                )
                ended.append(cohort)
        return ended

    def _group_reference(
        self, key: CohortKey, latest: int | None, now: float
    ) -> Cohort | Tombstone | None:
        """An active or the newest terminal cohort of the group, to compare prompts with."""
        scope = key.group_scope
        attempts = self._active_by_group.get(scope) if scope is not None else None
        if attempts:
            return next(iter(attempts.values()))
        if latest is None:
            return None
        return self.store.tombstone(CohortKey(key.group_id, None, latest, key.principal), now)

    def _collection_expired(self, cohort: Cohort) -> Failed:
        missing = [i for i in range(cohort.group_size) if i not in cohort.members]
        shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
        reason = (
            f"collection deadline expired (cohort_collection_timeout_s="
            f"{self.config.cohort_collection_timeout_s:g}) with {len(cohort.members)}/"
            f"{cohort.group_size} members; missing rollout_index: {shown}"
        )
        return Failed(clip_reason(reason), legacy=not cohort.key.explicit)

    def _end(self, cohort: Cohort, event: Event, outcome: Outcome, now: float) -> None:
        """Make a cohort terminal: record its outcome, leave a tombstone, drop its bodies."""
        cohort.phase = transition(cohort.phase, event)
        if self._active.pop(cohort.key, None) is not None:
            principal = cohort.key.principal
            left = self._active_by_principal[principal] - 1
            if left:
                self._active_by_principal[principal] = left
            else:
                del self._active_by_principal[principal]
        gid = cohort.key.group_scope
        if gid is not None:
            attempts = self._active_by_group.get(gid)
            if attempts is not None:
                attempts.pop(cohort.key.attempt, None)
                if not attempts:
                    del self._active_by_group[gid]
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
            tomb = Tombstone(
                key=cohort.key,
                group_size=cohort.group_size,
                prompt_digest=cohort.prompt_digest,
                digests=digests,
                outcome=outcome,
                finished_at=now + self.wall_offset,
            )
            expires = now + self.config.cohort_result_ttl_s + self.wall_offset
            self._outbox.append(TombstoneRecord(tomb, expires))
            self.store.put_tombstone(tomb, now)
        cohort.members = {}
        cohort.snapshot = None

    def _sweep(self, now: float) -> None:
        self.evictions_examined += self.store.evict(now, self._active_by_group.__contains__)

    def _warn_missing_attempt(self, sub: Submission) -> None:
        if not self._warned_missing_attempt:
            self._warned_missing_attempt = True
            log.warning(
                "member of group %r has no group_attempt; treating it as attempt 0. "
                "Send group_attempt explicitly and increase it when you regenerate a group.",
                sub.coords.group_id,
            )

    # ------------------------------------------------------------------ refusals
    def _reject(self, reason: Reason, message: str, sub: Submission, **meta: str) -> SubmitDecision:
        rejection = Rejection(reason, message, coords_metadata(sub.coords, **meta))
        return SubmitDecision(Disposition.REJECTED, rejection=rejection)

    def _mismatch(self, sub: Submission, group_size: int, digest: str) -> SubmitDecision:
        if group_size != sub.group_size:
            what = f"group_size {sub.group_size} differs from the cohort's {group_size}"
        else:
            what = (
                f"the prompt (digest {sub.prompt_digest[:12]}) differs from the cohort's "
                f"(digest {digest[:12]})"
            )
        return self._reject(Reason.PROMPT_MISMATCH, f"cohort {sub.key}: {what}", sub)

    def _slot_conflict(self, sub: Submission) -> SubmitDecision:
        return self._reject(
            Reason.SLOT_CONFLICT,
            f"cohort {sub.key}: slot {sub.rollout_index} already holds a different response",
            sub,
        )

    def _closed(self, sub: Submission, phase: Phase) -> SubmitDecision:
        return self._reject(
            Reason.COHORT_CLOSED,
            f"cohort {sub.key} is {phase.value}; it accepts no new members",
            sub,
        )

    def _failed(self, sub: Submission, outcome: Failed) -> SubmitDecision:
        return SubmitDecision(
            Disposition.REJECTED,
            rejection=failure_rejection(sub.key, outcome, coords_metadata(sub.coords)),
        )

    def _new_cohort_refusal(self, sub: Submission, *, superseded: int) -> SubmitDecision | None:
        """Why ``sub`` may not open a cohort now, or None: draining, then the deployment's
        ``max_active_cohorts``, then its principal's share. ``superseded`` cohorts of its
        group end if it opens, so they do not count against it. The one place these
        bounds are decided (a replica's registry sees the deployment's counts)."""
        if self._draining:
            return self._shutting_down(sub)
        if self._active_total() - superseded >= self.config.max_active_cohorts:
            return self._capacity_exhausted(sub)
        if self._over_principal_quota(sub.key.principal, superseded):
            return self._principal_quota_exhausted(sub)
        return None

    def _capacity_exhausted(self, sub: Submission) -> SubmitDecision:
        return self._reject(
            Reason.CAPACITY_EXHAUSTED,
            f"the server holds max_active_cohorts={self.config.max_active_cohorts} active "
            "cohorts; retry later",
            sub,
        )

    def _over_principal_quota(self, principal: str, superseded: int) -> bool:
        quota = self.config.max_active_cohorts_per_principal
        if quota is None:
            return False
        held = self._active_by_principal.get(principal, 0)
        held += self._elsewhere_by_principal.get(principal, 0)
        return held - superseded >= quota

    def _active_total(self) -> int:
        return len(self._active) + self._elsewhere

    def _principal_quota_exhausted(self, sub: Submission) -> SubmitDecision:
        return self._reject(
            Reason.CAPACITY_EXHAUSTED,
            f"principal {sub.key.principal!r} holds max_active_cohorts_per_principal="
            f"{self.config.max_active_cohorts_per_principal} active cohorts; retry later",
            sub,
            principal=sub.key.principal,
        )

    def _shutting_down(self, sub: Submission) -> SubmitDecision:
        return self._reject(
            Reason.SHUTTING_DOWN, "the server is shutting down; retry on another replica", sub
        )


def _member_record(key: CohortKey, member: Member) -> MemberRecord:
    return MemberRecord(key, member.coords, member.candidate.digest, member.candidate.texts)


def legacy_outcome(outcome: Failed | Masked) -> Failed | Masked:
    """The outcome a failed legacy cohort records: marked legacy, advice included.

    A masked result carries the advice in its ``failure_reason`` (clipped so the advice
    always survives); a failure gets it appended to its status message.
    """
    if isinstance(outcome, Failed):
        return Failed(outcome.reason, legacy=True)
    room = MAX_FAILURE_REASON - len(LEGACY_RETRY_ADVICE.encode()) - 2
    return Masked(f"{clip(outcome.reason, room)}. {LEGACY_RETRY_ADVICE}", outcome.metrics)


def failure_rejection(key: CohortKey, outcome: Failed, meta: Mapping[str, str]) -> Rejection:
    """The ABORTED/COHORT_FAILED refusal for members of a failed cohort.

    The key and reason are clipped so that the whole message, and the legacy advice at
    its end, fits the status message bound.
    """
    message = f"cohort {clip(str(key), 160)} failed: {clip(outcome.reason, 560)}"
    if outcome.legacy:
        message = f"{message}. {LEGACY_RETRY_ADVICE}"
    return Rejection(Reason.COHORT_FAILED, message, dict(meta))
