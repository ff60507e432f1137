"""Per-field bounds on incoming messages, checked on the wire types before any work.

``max_message_bytes`` bounds a whole message (RESOURCE_EXHAUSTED); these bound its
parts, so that one field cannot hold the whole budget and a judge prompt stays within
what the judge can read. A violation is INVALID_ARGUMENT / INVALID_MEMBER with a
``BadRequest`` field violation naming the field and the limit: retrying the same request
cannot succeed, the client has to shorten it.
"""

from __future__ import annotations

from typing import Protocol

from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_grpc.cohort.identity import coords_metadata
from genrm_grpc.cohort.model import Reason, Rejection
from genrm_grpc.runtime.plan import PassPlan
from genrm_grpc.server.convert import coords_from_proto

#: Roles are short words (user, assistant, system, ...); no configuration needed.
MAX_ROLE_CHARS = 64


class BoundsView(Protocol):
    """The settings the field checks read (a scoped view; ``Settings`` satisfies it)."""

    @property
    def max_group_size(self) -> int: ...
    @property
    def max_prompt_messages(self) -> int: ...
    @property
    def max_text_chars(self) -> int: ...
    @property
    def max_compare_candidates(self) -> int: ...
    #: The most judge calls one cohort may need (checked at every member against the
    #: group_size it declares, before any work is done), counted with ``pass_plan()``.
    @property
    def max_judge_passes_per_cohort(self) -> int: ...
    def pass_plan(self) -> PassPlan: ...


class FieldBounds:
    """Checks requests against the bounds of a :class:`BoundsView` (holds no copy of them)."""

    __slots__ = ("limits", "passes")

    def __init__(self, limits: BoundsView) -> None:
        self.limits = limits
        self.passes = limits.pass_plan()

    def submission(self, request: pb.SubmitMemberRequest) -> Rejection | None:
        ref = request.member
        if ref.HasField("group_size") and ref.group_size > self.limits.max_group_size:
            bad: Rejection | None = _violation(
                "member.group_size",
                f"must be at most max_group_size={self.limits.max_group_size}, "
                f"got {ref.group_size}",
            )
        elif ref.HasField("group_size") and self._too_many_passes(ref.group_size):
            bad = _violation(
                "member.group_size",
                f"group_size {ref.group_size} needs {self.passes.pass_count(ref.group_size)} "
                f"judge passes ({self.passes.describe()}); at most max_judge_passes_per_cohort="
                f"{self.limits.max_judge_passes_per_cohort}",
            )
        else:
            bad = self._prompt(request.prompt) or self._candidate(request.candidate, "candidate")
        if bad is None:
            return None
        # Name the member in ErrorInfo like every other refusal of a member does.
        meta = coords_metadata(coords_from_proto(ref))
        return Rejection(bad.reason, bad.message, meta, bad.field_violations)

    def _too_many_passes(self, group_size: int) -> bool:
        return self.passes.pass_count(group_size) > self.limits.max_judge_passes_per_cohort

    def compare(self, request: pb.CompareRequest) -> Rejection | None:
        count = len(request.candidates)
        if count > self.limits.max_compare_candidates:
            return _violation(
                "candidates",
                f"at most max_compare_candidates={self.limits.max_compare_candidates} candidates, "
                f"got {count}",
            )
        bad = self._prompt(request.prompt)
        for n, candidate in enumerate(request.candidates):
            if bad is not None:
                break
            bad = self._candidate(candidate, f"candidates[{n}]")
        return bad

    def _prompt(self, prompt: pb.Prompt) -> Rejection | None:
        count = len(prompt.messages)
        if count > self.limits.max_prompt_messages:
            return _violation(
                "prompt.messages",
                f"at most max_prompt_messages={self.limits.max_prompt_messages} messages, "
                f"got {count}",
            )
        for n, message in enumerate(prompt.messages):
            if len(message.role) > MAX_ROLE_CHARS:
                return _too_long(f"prompt.messages[{n}].role", MAX_ROLE_CHARS, len(message.role))
            bad = self._text(f"prompt.messages[{n}].content", message.content)
            if bad is not None:
                return bad
        return self._text("prompt.principle", prompt.principle) or self._text(
            "prompt.baseline_response", prompt.baseline_response
        )

    def _candidate(self, candidate: pb.Candidate, where: str) -> Rejection | None:
        return (
            self._text(f"{where}.output_text", candidate.output_text)
            or self._text(f"{where}.reasoning_text", candidate.reasoning_text)
            or self._text(f"{where}.responses_api_json", candidate.responses_api_json)
        )

    def _text(self, field_name: str, value: str) -> Rejection | None:
        if len(value) > self.limits.max_text_chars:
            return _too_long(field_name, self.limits.max_text_chars, len(value))
        return None


def _too_long(field_name: str, limit: int, got: int) -> Rejection:
    return _violation(field_name, f"longer than {limit} characters (got {got})")


def _violation(field_name: str, description: str) -> Rejection:
    return Rejection(
        Reason.INVALID_MEMBER,
        f"invalid request: {field_name}: {description}",
        field_violations=((field_name, description),),
    )
