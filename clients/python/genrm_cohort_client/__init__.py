"""Collector-side client of genrm-grpc.

The generated stubs live in ``genrm.cohort.v1`` (``cohort_pb2``, ``cohort_pb2_grpc``);
this package adds:

* :class:`CohortClient` (asyncio) and :class:`SyncCohortClient` (blocking, its own loop
  in a thread): ``evaluate_group`` over ``StreamGroups`` (results as they arrive),
  ``submit_member``, ``compare``, ``get_cohort``; group ids minted client-side
  (:func:`new_group_id`, time-ordered UUIDv7) and attempts tracked per group;
* :class:`RetryPolicy` (tenacity): ``UNAVAILABLE`` → resend the same submission with
  exponential backoff and jitter, a WARNING on the first retry and every minute after,
  giving up after ``max_elapsed_s`` (900 s) of retrying; ``ABORTED`` → optionally a
  replacement group as attempt + 1; never INVALID_ARGUMENT / FAILED_PRECONDITION /
  ALREADY_EXISTS; ``client.stats`` (:class:`ClientStats`) counts what happened;
* :class:`ChannelOptions`: keepalive matched to the server, message limits,
  wait-for-ready, TLS / mTLS and a bearer token;
* :func:`score_groups` / :func:`score_samples` (module ``batch``): blocking batch
  scoring for verl / OpenRLHF reward functions, rewards in input order plus the mask;
* :class:`CohortError`, the one exception type (code, ErrorInfo reason, metadata; its
  subclass :class:`CohortConnectError` when nothing answers at the address within
  ``ChannelOptions.connect_timeout_s``), and
  :func:`error_info` / :func:`status_error_info` to decode any status.

What to do with a status (see docs/protocol.md):
``UNAVAILABLE`` → retry the same call; ``ABORTED`` → the group failed, regenerate the
whole group under a new ``group_attempt``; anything else → do not retry.
"""

from __future__ import annotations

from genrm_cohort_client.batch import (
    BatchScores,
    MaskedGroupsError,
    SampleScores,
    score_groups,
    score_groups_async,
    score_samples,
)
from genrm_cohort_client.client import (
    CandidateLike,
    CohortClient,
    MemberRefLike,
    PromptLike,
    Regenerate,
    make_candidate,
    make_member_ref,
    make_prompt,
)
from genrm_cohort_client.errors import (
    CLIENT_DOMAIN,
    CONNECT_FAILED,
    NEVER_RETRY,
    REGENERATE_GROUP,
    RETRY_SAME_CALL,
    SERVER_OVERLOADED,
    CohortConnectError,
    CohortError,
    ErrorDetails,
    error_info,
    status_error_info,
)
from genrm_cohort_client.ids import GroupAttempts, new_group_id, uuid7
from genrm_cohort_client.options import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ChannelOptions,
    RetryPolicy,
    make_channel,
)
from genrm_cohort_client.stats import ClientStats
from genrm_cohort_client.sync import SyncCohortClient

__all__ = [
    "CLIENT_DOMAIN",
    "CONNECT_FAILED",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "NEVER_RETRY",
    "REGENERATE_GROUP",
    "RETRY_SAME_CALL",
    "SERVER_OVERLOADED",
    "BatchScores",
    "CandidateLike",
    "ChannelOptions",
    "ClientStats",
    "CohortClient",
    "CohortConnectError",
    "CohortError",
    "ErrorDetails",
    "GroupAttempts",
    "MaskedGroupsError",
    "MemberRefLike",
    "PromptLike",
    "Regenerate",
    "RetryPolicy",
    "SampleScores",
    "SyncCohortClient",
    "error_info",
    "make_candidate",
    "make_channel",
    "make_member_ref",
    "make_prompt",
    "new_group_id",
    "score_groups",
    "score_groups_async",
    "score_samples",
    "status_error_info",
    "uuid7",
]
