"""Per-field bounds on incoming messages, checked on the wire types before any work.

``max_message_bytes`` bounds a whole message (RESOURCE_EXHAUSTED); these bound its
parts, so that one field cannot hold the whole budget and a judge prompt stays within
what the judge can read. A violation is INVALID_ARGUMENT / INVALID_MEMBER with a
``BadRequest`` field violation naming the field and the limit: retrying the same request
cannot succeed, the client has to shorten it.
"""

from __future__ import annotations

from dataclasses import dataclass

from genrm.cohort.v1 import cohort_pb2 as pb

from genrm_grpc.cohort.identity import coords_metadata
from genrm_grpc.cohort.model import Reason, Rejection
from genrm_grpc.runtime.plan import PassPlan
from genrm_grpc.server.convert import coords_from_proto

#: Roles are short words (user, assistant, system, ...); no configuration needed.
MAX_ROLE_CHARS = 64


@dataclass(frozen=True, slots=True)
class FieldBounds:
    max_group_size: int
    max_prompt_messages: int
    max_text_chars: int
    max_compare_candidates: int
    #: With ``passes``: the most judge calls one cohort may need (checked at every
    #: member against the group_size it declares, before any work is done).
    max_judge_passes_per_cohort: int | None = None
    passes: PassPlan | None = None

    def submission(self, request: pb.SubmitMemberRequest) -> Rejection | None:
        ref = request.member
        if ref.HasField("group_size") and ref.group_size > self.max_group_size:
            bad: Rejection | None = _violation(
                "member.group_size",
                f"must be at most max_group_size={self.max_group_size}, got {ref.group_size}",
            )
        elif ref.HasField("group_size") and self._too_many_passes(ref.group_size):
            assert self.passes is not None
            bad = _violation(
                "member.group_size",
                f"group_size {ref.group_size} needs {self.passes.pass_count(ref.group_size)} "
                f"judge passes ({self.passes.describe()}); at most max_judge_passes_per_cohort="
                f"{self.max_judge_passes_per_cohort}",
            )
        else:
            bad = self._prompt(request.prompt) or self._candidate(request.candidate, "candidate")
        if bad is None:
            return None
        # Name the member in ErrorInfo like every other refusal of a member does.
        meta = coords_metadata(coords_from_proto(ref))
        return Rejection(bad.reason, bad.message, meta, bad.field_violations)

    def _too_many_passes(self, group_size: int) -> bool:
        limit, plan = self.max_judge_passes_per_cohort, self.passes
        return limit is not None and plan is not None and plan.pass_count(group_size) > limit

    def compare(self, request: pb.CompareRequest) -> Rejection | None:
        count = len(request.candidates)
        if count > self.max_compare_candidates:
            return _violation(
                "candidates",
                f"at most max_compare_candidates={self.max_compare_candidates} candidates, "
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
        if count > self.max_prompt_messages:
            return _violation(
                "prompt.messages",
                f"at most max_prompt_messages={self.max_prompt_messages} messages, got {count}",
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
        if len(value) > self.max_text_chars:
            return _too_long(field_name, self.max_text_chars, len(value))
        return None


def _too_long(field_name: str, limit: int, got: int) -> Rejection:
    return _violation(field_name, f"longer than {limit} characters (got {got})")


def _violation(field_name: str, description: str) -> Rejection:
    return Rejection(
        Reason.INVALID_MEMBER,
        f"invalid request: {field_name}: {description}",
        field_violations=((field_name, description),),
    )
