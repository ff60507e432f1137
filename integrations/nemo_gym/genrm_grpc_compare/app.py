"""NeMo Gym resources server that scores rollouts with a genrm-grpc service.

Gym's agents call ``POST /verify`` once per rollout. This server forwards each rollout
to genrm-grpc's ``SubmitMember`` (one call per rollout, waiting until the whole group is
judged) and answers with Gym's verify response: the reward, or a masked result when
the judge failed (``mask_sample``, ``failure_kind``, ``failure_reason``,
``instance_config.mask_sample``, ``_ng_failure_class``). Cohort buffering, fencing of
attempts, replay of retried requests and judge scheduling all happen in genrm-grpc, so
this server keeps no cohort state of its own.

``POST /compare`` forwards a batch of responses to genrm-grpc's ``Compare``.
gRPC errors become the HTTP statuses Gym's genrm_compare gives for the same situation;
the table is in this directory's README.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import ChannelOptions, CohortClient, CohortError, RetryPolicy
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer

# Gym's row keys (nemo_gym.global_config names the first two; newer Gym all four).
TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
GROUP_ID_KEY = "_ng_group_id"
GROUP_ATTEMPT_KEY = "_ng_group_attempt"

FAILURE_KIND_JUDGE_FAILED = "judge_failed"


class GenRMGrpcCompareConfig(BaseResourcesServerConfig):
    """Where genrm-grpc is and how to call it. Scoring settings live in genrm-grpc."""

    name: str = "genrm_grpc_compare"
    #: gRPC target of genrm-grpc (``HOST:PORT``, or any gRPC target string).
    grpc_target: str = "127.0.0.1:50051"
    #: Group size sent with every member; None: the server's ``num_rollouts_per_prompt``.
    num_rollouts_per_prompt: int | None = Field(default=None, ge=1)
    #: TLS: on when ``tls`` is true or any certificate file is given.
    tls: bool = False
    tls_root_certs_file: str | None = None
    tls_client_cert_file: str | None = None
    tls_client_key_file: str | None = None
    tls_server_name: str | None = None
    #: Name of the environment variable holding the bearer token (never the token).
    token_env: str | None = None
    #: Deadline of one ``SubmitMember`` call: collection plus evaluation of the group.
    verify_timeout_s: float = Field(default=5400.0, gt=0, allow_inf_nan=False)
    #: Deadline of one ``Compare`` call.
    compare_timeout_s: float = Field(default=1800.0, gt=0, allow_inf_nan=False)
    #: True: a call waits (until its deadline) for genrm-grpc to be reachable instead of
    #: failing as UNAVAILABLE at once; False: unreachable → retried, then 503.
    wait_for_ready: bool = False
    #: Calls per request when genrm-grpc is UNAVAILABLE (restart, drain, network).
    unavailable_retries: int = Field(default=8, ge=1)
    #: Longest backoff between those calls.
    max_backoff_s: float = Field(default=10.0, ge=0, allow_inf_nan=False)
    #: Largest gRPC message sent or received.
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)


class GenRMGrpcVerifyRequest(BaseVerifyRequest):
    """Gym's verify request with the cohort coordinates of genrm_compare."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    principle: str | None = None
    prompt_id: str | None = None
    task_index: int | None = Field(default=None, alias=TASK_INDEX_KEY)
    group_id: str | None = Field(default=None, alias=GROUP_ID_KEY, min_length=1)
    group_attempt: int | None = Field(default=None, alias=GROUP_ATTEMPT_KEY, ge=0, strict=True)
    rollout_index: int | None = Field(default=None, alias=ROLLOUT_INDEX_KEY, ge=0, strict=True)


# Failure fields present only on masked results (Gym omits them otherwise).
_FAILURE_ONLY = ("_ng_failure_class", "_ng_failure_judge_error", "failure_kind", "failure_reason")


class GenRMGrpcVerifyResponse(BaseVerifyResponse):
    """Gym's verify response, as genrm_compare (cohort-lifecycle revision) returns it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    task_index: int | None = Field(default=None, alias=TASK_INDEX_KEY)
    group_id: str | None = Field(default=None, alias=GROUP_ID_KEY)
    group_attempt: int = Field(default=0, alias=GROUP_ATTEMPT_KEY)
    rollout_index: int | None = Field(default=None, alias=ROLLOUT_INDEX_KEY)
    reward_score_raw: float = 0.0
    reward_overall_score_raw: float = 0.0
    reward_overall_score: float = 0.0
    reward_length_adjustment: float = 0.0
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    instance_config: dict[str, Any] | None = None
    failure_class: str | None = Field(default=None, alias="_ng_failure_class")
    failure_judge_error: str | None = Field(default=None, alias="_ng_failure_judge_error")
    #: Served from genrm-grpc's cached outcome to a retried identical request.
    genrm_replayed: bool = False

    @model_serializer(mode="wrap")
    def _omit_absent_failure(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for key in _FAILURE_ONLY:
                if data.get(key) is None:
                    data.pop(key, None)
            if data.get("instance_config") is None:
                data.pop("instance_config", None)
        return data


class GenRMGrpcCompareRequest(BaseModel):
    """Gym's genrm_compare ``/compare`` request."""

    conversation_history: list[dict[str, str]]
    response_objs: list[dict[str, Any]]
    principle: str | None = None


class GenRMGrpcCompareResponse(BaseModel):
    """Gym's genrm_compare ``/compare`` response."""

    rewards: list[float]
    comparison_results: list[dict[str, Any] | None] = None
    metrics: dict[str, float] | None = None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        part = part.model_dump() if hasattr(part, "model_dump") else part
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
            parts.append(str(part.get("text") or ""))
    return "".join(parts)


def prompt_from_input(input_items: Any) -> list[tuple[str, str]]:
    """``responses_create_params.input`` as ``(role, content)`` turns (messages only)."""
    if isinstance(input_items, str):
        return [("user", input_items)]
    turns = []
    for item in input_items or []:
        item = item.model_dump() if hasattr(item, "model_dump") else item
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue  # tool calls and their outputs are not part of the judged prompt
        turns.append((str(item.get("role") or "user"), _content_text(item.get("content"))))
    return turns


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


# (status code, ErrorInfo reason) → HTTP status, as Gym's genrm_compare answers.
_HTTP_STATUS = {
    ("ALREADY_EXISTS", "SLOT_CONFLICT"): 409,
    ("FAILED_PRECONDITION", "COHORT_CLOSED"): 409,
    ("FAILED_PRECONDITION", "PROMPT_MISMATCH"): 409,
    ("FAILED_PRECONDITION", "ATTEMPT_SUPERSEDED"): 409,
    ("ABORTED", "COHORT_FAILED"): 503,
    ("UNAVAILABLE", "SHUTTING_DOWN"): 503,
    ("UNAVAILABLE", "JUDGE_FAILED"): 503,
    ("UNAVAILABLE", ""): 503,
    ("RESOURCE_EXHAUSTED", "CAPACITY_EXHAUSTED"): 503,
    ("INVALID_ARGUMENT", "INVALID_MEMBER"): 422,
    ("DEADLINE_EXCEEDED", ""): 504,
    ("UNAUTHENTICATED", "UNAUTHENTICATED"): 502,
}


def http_error(exc: CohortError, body: GenRMGrpcVerifyRequest | None = None) -> HTTPException:
    """The HTTPException Gym's genrm_compare raises for the same situation."""
    code, reason = exc.code.name, exc.reason
    status = _HTTP_STATUS.get((code, reason), _HTTP_STATUS.get((code, ""), 502))
    meta = exc.metadata
    index = body.rollout_index if body is not None else meta.get("rolloutIndex")
    if reason == "SLOT_CONFLICT":
        detail = f"GenRM already has a different response for rollout_index={index}"
    elif reason == "PROMPT_MISMATCH":
        detail = f"GenRM group received inconsistent prompt or principle content: {exc.message}"
    elif reason == "ATTEMPT_SUPERSEDED":
        attempt = body.group_attempt if body is not None else meta.get("groupAttempt")
        latest = meta.get("latestAttempt", "a newer attempt")
        detail = f"GenRM attempt {attempt or 0} was superseded by attempt {latest}"
    elif reason == "COHORT_CLOSED":
        detail = f"GenRM cohort is already closed: {exc.message}"
    elif reason == "SHUTTING_DOWN":
        detail = "GenRM server is shutting down"
    elif reason == "COHORT_FAILED":
        detail = exc.message
        if body is not None and body.group_id is None:
            detail += (
                " This legacy group has failed; retry requires a fresh _ng_group_id shared by"
                " every member."
            )
    elif reason == "INVALID_MEMBER":
        violations = "; ".join(f"{f}: {d}" for f, d in exc.field_violations)
        detail = f"invalid rollout for genrm-grpc: {violations or exc.message}"
    elif code == "DEADLINE_EXCEEDED":
        detail = f"genrm-grpc gave no result within this server's deadline: {exc.message}"
    elif code == "UNAUTHENTICATED":
        detail = "genrm-grpc refused this resources server's credentials (check token_env)"
    else:
        detail = f"genrm-grpc: {code} {reason}: {exc.message}".replace("  ", " ")
    return HTTPException(status_code=status, detail=detail)


class GenRMGrpcCompareResourcesServer(SimpleResourcesServer):
    """Gym resources server backed by genrm-grpc (see the module docstring)."""

    config: GenRMGrpcCompareConfig
    _client: CohortClient | None = PrivateAttr(default=None)

    def _cohort_client(self) -> CohortClient:
        # grpc.aio channels belong to the loop that created them: the server's loop.
        if self._client is None:
            cfg = self.config
            token = None
            if cfg.token_env:
                token = os.environ.get(cfg.token_env) or None
                if token is None:
                    raise HTTPException(
                        status_code=500, detail=f"token_env {cfg.token_env!r} is not set"
                    )
            options = ChannelOptions(
                tls=cfg.tls,
                root_certificates=_read(cfg.tls_root_certs_file),
                client_cert_chain=_read(cfg.tls_client_cert_file),
                client_private_key=_read(cfg.tls_client_key_file),
                server_name_override=cfg.tls_server_name,
                bearer_token=token,
                max_send_message_bytes=cfg.max_message_bytes,
                max_receive_message_bytes=cfg.max_message_bytes,
                wait_for_ready=cfg.wait_for_ready,
            )
            retry = RetryPolicy(
                max_attempts=cfg.unavailable_retries, max_backoff_s=cfg.max_backoff_s
            )
            self._client = CohortClient(cfg.grpc_target, options=options, retry=retry)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        parent = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            async with parent(app) as state:
                try:
                    yield state
                finally:
                    await self.aclose()

        app.router.lifespan_context = lifespan
        app.post("/compare")(self.compare)
        return app

    def _member(self, body: GenRMGrpcVerifyRequest) -> pb.MemberRef:
        if body.rollout_index is None:
            raise HTTPException(status_code=422, detail=f"{ROLLOUT_INDEX_KEY} is required")
        if body.group_id is None and body.task_index is None and body.prompt_id is None:
            raise HTTPException(
                status_code=422,
                detail=f"either {TASK_INDEX_KEY} or {GROUP_ID_KEY} is required",
            )
        size = self.config.num_rollouts_per_prompt
        if size is not None and body.rollout_index >= size:
            raise HTTPException(
                status_code=422, detail=f"{ROLLOUT_INDEX_KEY} must be in [0, {size})"
            )
        member = pb.MemberRef(rollout_index=body.rollout_index)
        if body.group_id is not None:
            member.group_id = body.group_id
            member.group_attempt = body.group_attempt or 0
        elif body.group_attempt is not None:
            member.group_attempt = body.group_attempt
        if body.task_index is not None:
            member.task_index = body.task_index
        if body.prompt_id is not None:
            member.prompt_id = body.prompt_id
        if size is not None:
            member.group_size = size
        return member

    @staticmethod
    def _prompt(body: GenRMGrpcVerifyRequest) -> pb.Prompt:
        params = body.responses_create_params
        prompt = pb.Prompt(
            messages=[
                pb.ChatMessage(role=role, content=content)
                for role, content in prompt_from_input(getattr(params, "input", None))
            ]
        )
        if body.principle:
            prompt.principle = body.principle
        metadata = getattr(params, "metadata", None) or {}
        baseline = metadata.get("baseline_response") if isinstance(metadata, dict) else None
        if isinstance(baseline, str) and baseline.strip():
            prompt.baseline_response = baseline
        return prompt

    async def verify(self, body: GenRMGrpcVerifyRequest) -> GenRMGrpcVerifyResponse:
        """Forward one rollout to ``SubmitMember``; wait for the group's rewards."""
        member = self._member(body)
        response = body.response
        answer = response.model_dump(mode="json") if hasattr(response, "model_dump") else response
        candidate = pb.Candidate(responses_api_json=json.dumps(answer, ensure_ascii=False))
        try:
            result = await self._cohort_client().submit_member(
                member, self._prompt(body), candidate, timeout=self.config.verify_timeout_s
            )
        except CohortError as exc:
            raise http_error(exc, body) from None
        return self._verify_response(body, result)

    @staticmethod
    def _verify_response(
        body: GenRMGrpcVerifyRequest, result: pb.MemberResult
    ) -> GenRMGrpcVerifyResponse:
        data = body.model_dump(by_alias=True)  # echo the request, extras included
        data.update(
            {
                TASK_INDEX_KEY: body.task_index,
                GROUP_ID_KEY: body.group_id,
                GROUP_ATTEMPT_KEY: body.group_attempt or 0,
                ROLLOUT_INDEX_KEY: body.rollout_index,
                "reward": result.reward,
                "reward_score_raw": result.reward_score_raw,
                "reward_overall_score_raw": result.reward_overall_score_raw,
                "reward_overall_score": result.reward_overall_score,
                "reward_length_adjustment": result.reward_length_adjustment,
                "mask_sample": result.mask_sample,
                "genrm_replayed": result.replayed,
                **dict(result.group_metrics),
            }
        )
        if result.mask_sample:
            reason = result.failure_reason[:2000]
            instance_config = data.get("instance_config")
            data.update(
                {
                    "reward": 0.0,  # placeholder, never a scored result
                    "failure_kind": FAILURE_KIND_JUDGE_FAILED,
                    "failure_reason": reason,
                    # Older RL consumers read the mask from instance_config.
                    "instance_config": {
                        **(instance_config if isinstance(instance_config, dict) else {}),
                        "mask_sample": True,
                    },
                    "_ng_failure_class": FAILURE_KIND_JUDGE_FAILED,
                    "_ng_failure_judge_error": reason,
                }
            )
        return GenRMGrpcVerifyResponse.model_validate(data)

    async def compare(self, body: GenRMGrpcCompareRequest) -> GenRMGrpcCompareResponse:
        """Forward a batch of responses to ``Compare`` (stateless, one reward each)."""
        prompt = pb.Prompt(
            messages=[
                pb.ChatMessage(role=str(m.get("role", "user")), content=str(m.get("content", "")))
                for m in body.conversation_history
            ]
        )
        if body.principle:
            prompt.principle = body.principle
        candidates = [
            pb.Candidate(responses_api_json=json.dumps(obj, ensure_ascii=False))
            for obj in body.response_objs
        ]
        try:
            reply = await self._cohort_client().compare(
                prompt, candidates, timeout=self.config.compare_timeout_s
            )
        except CohortError as exc:
            raise http_error(exc) from None
        return GenRMGrpcCompareResponse(
            rewards=list(reply.rewards),
            comparison_results=[
                {
                    "response_i": v.response_i,
                    "response_j": v.response_j,
                    "judge_idx": v.judge_index,
                    "score_1": v.score_1,
                    "score_2": v.score_2,
                    "ranking": v.ranking,
                }
                for v in reply.comparisons
            ],
            metrics=dict(reply.metrics),
        )


if __name__ == "__main__":
    GenRMGrpcCompareResourcesServer.run_webserver()
