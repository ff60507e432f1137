from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FailureKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_KIND_UNSPECIFIED: _ClassVar[FailureKind]
    FAILURE_KIND_JUDGE_FAILED: _ClassVar[FailureKind]

class CohortPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COHORT_PHASE_UNSPECIFIED: _ClassVar[CohortPhase]
    COHORT_PHASE_COLLECTING: _ClassVar[CohortPhase]
    COHORT_PHASE_EVALUATING: _ClassVar[CohortPhase]
    COHORT_PHASE_COMPLETED: _ClassVar[CohortPhase]
    COHORT_PHASE_FAILED: _ClassVar[CohortPhase]
FAILURE_KIND_UNSPECIFIED: FailureKind
FAILURE_KIND_JUDGE_FAILED: FailureKind
COHORT_PHASE_UNSPECIFIED: CohortPhase
COHORT_PHASE_COLLECTING: CohortPhase
COHORT_PHASE_EVALUATING: CohortPhase
COHORT_PHASE_COMPLETED: CohortPhase
COHORT_PHASE_FAILED: CohortPhase

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("messages", "principle", "baseline_response")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PRINCIPLE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    principle: str
    baseline_response: str
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., principle: _Optional[str] = ..., baseline_response: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("output_text", "reasoning_text", "responses_api_json")
    OUTPUT_TEXT_FIELD_NUMBER: _ClassVar[int]
    REASONING_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_API_JSON_FIELD_NUMBER: _ClassVar[int]
    output_text: str
    reasoning_text: str
    responses_api_json: str
    def __init__(self, output_text: _Optional[str] = ..., reasoning_text: _Optional[str] = ..., responses_api_json: _Optional[str] = ...) -> None: ...

class MemberRef(_message.Message):
    __slots__ = ("group_id", "group_attempt", "rollout_index", "task_index", "prompt_id", "group_size")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    group_attempt: int
    rollout_index: int
    task_index: int
    prompt_id: str
    group_size: int
    def __init__(self, group_id: _Optional[str] = ..., group_attempt: _Optional[int] = ..., rollout_index: _Optional[int] = ..., task_index: _Optional[int] = ..., prompt_id: _Optional[str] = ..., group_size: _Optional[int] = ...) -> None: ...

class SubmitMemberRequest(_message.Message):
    __slots__ = ("member", "prompt", "candidate")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    member: MemberRef
    prompt: Prompt
    candidate: Candidate
    def __init__(self, member: _Optional[_Union[MemberRef, _Mapping]] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ..., candidate: _Optional[_Union[Candidate, _Mapping]] = ...) -> None: ...

class SubmitMemberResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: MemberResult
    def __init__(self, result: _Optional[_Union[MemberResult, _Mapping]] = ...) -> None: ...

class MemberResult(_message.Message):
    __slots__ = ("member", "reward", "reward_score_raw", "reward_overall_score_raw", "reward_overall_score", "reward_length_adjustment", "group_metrics", "replayed", "mask_sample", "failure_kind", "failure_reason", "comparisons", "judge_passes_reused", "judge_passes_resumed")
    class GroupMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_SCORE_RAW_FIELD_NUMBER: _ClassVar[int]
    REWARD_OVERALL_SCORE_RAW_FIELD_NUMBER: _ClassVar[int]
    REWARD_OVERALL_SCORE_FIELD_NUMBER: _ClassVar[int]
    REWARD_LENGTH_ADJUSTMENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_METRICS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    MASK_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_KIND_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    COMPARISONS_FIELD_NUMBER: _ClassVar[int]
    JUDGE_PASSES_REUSED_FIELD_NUMBER: _ClassVar[int]
    JUDGE_PASSES_RESUMED_FIELD_NUMBER: _ClassVar[int]
    member: MemberRef
    reward: float
    reward_score_raw: float
    reward_overall_score_raw: float
    reward_overall_score: float
    reward_length_adjustment: float
    group_metrics: _containers.ScalarMap[str, float]
    replayed: bool
    mask_sample: bool
    failure_kind: FailureKind
    failure_reason: str
    comparisons: _containers.RepeatedCompositeFieldContainer[PairVerdict]
    judge_passes_reused: int
    judge_passes_resumed: int
    def __init__(self, member: _Optional[_Union[MemberRef, _Mapping]] = ..., reward: _Optional[float] = ..., reward_score_raw: _Optional[float] = ..., reward_overall_score_raw: _Optional[float] = ..., reward_overall_score: _Optional[float] = ..., reward_length_adjustment: _Optional[float] = ..., group_metrics: _Optional[_Mapping[str, float]] = ..., replayed: _Optional[bool] = ..., mask_sample: _Optional[bool] = ..., failure_kind: _Optional[_Union[FailureKind, str]] = ..., failure_reason: _Optional[str] = ..., comparisons: _Optional[_Iterable[_Union[PairVerdict, _Mapping]]] = ..., judge_passes_reused: _Optional[int] = ..., judge_passes_resumed: _Optional[int] = ...) -> None: ...

class PairVerdict(_message.Message):
    __slots__ = ("response_i", "response_j", "judge_index", "score_1", "score_2", "ranking", "parse_failed")
    RESPONSE_I_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_J_FIELD_NUMBER: _ClassVar[int]
    JUDGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_1_FIELD_NUMBER: _ClassVar[int]
    SCORE_2_FIELD_NUMBER: _ClassVar[int]
    RANKING_FIELD_NUMBER: _ClassVar[int]
    PARSE_FAILED_FIELD_NUMBER: _ClassVar[int]
    response_i: int
    response_j: int
    judge_index: int
    score_1: float
    score_2: float
    ranking: float
    parse_failed: bool
    def __init__(self, response_i: _Optional[int] = ..., response_j: _Optional[int] = ..., judge_index: _Optional[int] = ..., score_1: _Optional[float] = ..., score_2: _Optional[float] = ..., ranking: _Optional[float] = ..., parse_failed: _Optional[bool] = ...) -> None: ...

class StreamGroupsRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: SubmitMemberRequest
    def __init__(self, member: _Optional[_Union[SubmitMemberRequest, _Mapping]] = ...) -> None: ...

class StreamGroupsResponse(_message.Message):
    __slots__ = ("accepted", "result", "error", "pair_judged")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PAIR_JUDGED_FIELD_NUMBER: _ClassVar[int]
    accepted: MemberAccepted
    result: MemberResult
    error: MemberError
    pair_judged: PairJudged
    def __init__(self, accepted: _Optional[_Union[MemberAccepted, _Mapping]] = ..., result: _Optional[_Union[MemberResult, _Mapping]] = ..., error: _Optional[_Union[MemberError, _Mapping]] = ..., pair_judged: _Optional[_Union[PairJudged, _Mapping]] = ...) -> None: ...

class MemberAccepted(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: MemberRef
    def __init__(self, member: _Optional[_Union[MemberRef, _Mapping]] = ...) -> None: ...

class MemberError(_message.Message):
    __slots__ = ("member", "status")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    member: MemberRef
    status: _status_pb2.Status
    def __init__(self, member: _Optional[_Union[MemberRef, _Mapping]] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class PairJudged(_message.Message):
    __slots__ = ("member", "response_i", "response_j", "judge_index")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_I_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_J_FIELD_NUMBER: _ClassVar[int]
    JUDGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    member: MemberRef
    response_i: int
    response_j: int
    judge_index: int
    def __init__(self, member: _Optional[_Union[MemberRef, _Mapping]] = ..., response_i: _Optional[int] = ..., response_j: _Optional[int] = ..., judge_index: _Optional[int] = ...) -> None: ...

class CompareRequest(_message.Message):
    __slots__ = ("prompt", "candidates")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    prompt: Prompt
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    def __init__(self, prompt: _Optional[_Union[Prompt, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ...) -> None: ...

class CompareResponse(_message.Message):
    __slots__ = ("rewards", "comparisons", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    COMPARISONS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    rewards: _containers.RepeatedScalarFieldContainer[float]
    comparisons: _containers.RepeatedCompositeFieldContainer[PairVerdict]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, rewards: _Optional[_Iterable[float]] = ..., comparisons: _Optional[_Iterable[_Union[PairVerdict, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetCohortRequest(_message.Message):
    __slots__ = ("member", "prompt")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    member: MemberRef
    prompt: Prompt
    def __init__(self, member: _Optional[_Union[MemberRef, _Mapping]] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ...) -> None: ...

class GetCohortResponse(_message.Message):
    __slots__ = ("cohort",)
    COHORT_FIELD_NUMBER: _ClassVar[int]
    cohort: CohortInfo
    def __init__(self, cohort: _Optional[_Union[CohortInfo, _Mapping]] = ...) -> None: ...

class CohortInfo(_message.Message):
    __slots__ = ("key", "phase", "group_size", "present_indices", "latest_attempt", "failure_reason", "seconds_to_deadline", "judge_passes_reused", "judge_passes_resumed", "judge_in_flight", "judge_tokens_streamed")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRESENT_INDICES_FIELD_NUMBER: _ClassVar[int]
    LATEST_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TO_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    JUDGE_PASSES_REUSED_FIELD_NUMBER: _ClassVar[int]
    JUDGE_PASSES_RESUMED_FIELD_NUMBER: _ClassVar[int]
    JUDGE_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    JUDGE_TOKENS_STREAMED_FIELD_NUMBER: _ClassVar[int]
    key: str
    phase: CohortPhase
    group_size: int
    present_indices: _containers.RepeatedScalarFieldContainer[int]
    latest_attempt: int
    failure_reason: str
    seconds_to_deadline: float
    judge_passes_reused: int
    judge_passes_resumed: int
    judge_in_flight: int
    judge_tokens_streamed: int
    def __init__(self, key: _Optional[str] = ..., phase: _Optional[_Union[CohortPhase, str]] = ..., group_size: _Optional[int] = ..., present_indices: _Optional[_Iterable[int]] = ..., latest_attempt: _Optional[int] = ..., failure_reason: _Optional[str] = ..., seconds_to_deadline: _Optional[float] = ..., judge_passes_reused: _Optional[int] = ..., judge_passes_resumed: _Optional[int] = ..., judge_in_flight: _Optional[int] = ..., judge_tokens_streamed: _Optional[int] = ...) -> None: ...
