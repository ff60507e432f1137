"""verl (0.9.x) reward manager backed by genrm-grpc (see docs/integrations.md, "verl").

verl 0.9's reward loop calls a reward manager's ``run_single(data)`` once per sample, in
one of ``reward.num_workers`` reward-loop worker processes picked at random, so the
samples of one prompt land in different processes. This manager submits each sample to
genrm-grpc as one member of its group (``SubmitMember``) and awaits the whole group's
rewards; genrm-grpc collects the group across processes and judges it once.

Load it with::

    reward.reward_manager.source=importlib
    reward.reward_manager.name=GenRMRewardManager
    reward.reward_manager.module.path=integrations/verl/genrm_reward.py
    +reward.reward_kwargs.genrm_target=genrm-grpc:50051

Identity (from what verl 0.9's agent loop hands every sample):

* group id ``verl/<uid>``: ``uid`` is a uuid4 drawn per prompt each time the trainer
  takes it from the dataloader (every step, every refill, every run), so another step's
  group or a resumed run never shares a cohort with this one;
* rollout index ``session_id``: the sample's position ``0 .. n-1`` among the prompt's
  ``actor_rollout_ref.rollout.n`` sessions (the V1 trainer, ``trainer.use_v1=True``, the
  default; the legacy trainer passes no position and is refused);
* group attempt 0: verl never regenerates a session under the same uid; a retried call
  of the same sample is an identical resubmission and replays the cached reward.

A masked sample (the judge failed for its group: genrm-grpc masks the whole group) gets
``score = masked_score`` (0.0), the same for every sample of the group, so the group's
mean and every GRPO advantage of the group are 0, and ``genrm_masked = 1.0`` in
``reward_extra_info``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from genrm.cohort.v1 import cohort_pb2 as pb
from genrm_cohort_client import CohortClient, CohortError
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

logger = logging.getLogger(__name__)

GROUP_PREFIX = "verl/"


class SiblingsStalledError(RuntimeError):
    """The group's other samples stopped arriving while this sample waited for them."""


def _plain(value: Any) -> Any:
    """numpy scalars and 0-d arrays (how non_tensor_batch values arrive) as Python values."""
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return value.item()
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def prompt_messages(raw_prompt: Any) -> list[pb.ChatMessage]:
    """verl's ``raw_prompt`` (a chat: ``[{"role", "content"}, ...]``) as ChatMessages."""
    raw = _plain(raw_prompt)
    if isinstance(raw, str):
        return [pb.ChatMessage(role="user", content=raw)]
    messages = []
    for turn in raw or []:
        if not isinstance(turn, Mapping):
            continue
        content = turn.get("content")
        if not isinstance(content, str):  # multi-part content: keep the text parts
            content = "".join(
                str(part.get("text") or "")
                for part in content or []
                if isinstance(part, Mapping) and part.get("type") == "text"
            )
        messages.append(pb.ChatMessage(role=str(turn.get("role") or "user"), content=content))
    return messages


class GenRMRewardManager(RewardManagerBase):
    """verl reward manager: one ``SubmitMember`` per sample, rewards relative to its group.

    Settings, all under ``reward.reward_kwargs`` (add them with ``+``):

    ``genrm_target``
        gRPC target of genrm-grpc (default ``$GENRM_GRPC_TARGET``, else
        ``127.0.0.1:50051``).
    ``genrm_group_size``
        Samples per group (default ``actor_rollout_ref.rollout.n``).
    ``genrm_timeout_s``
        Deadline of one sample's call: collection plus judging of its group (3600).
    ``genrm_sibling_timeout_s``
        Fail the sample when no other sample of its group arrived at genrm-grpc for this
        long while it waited (300): verl would otherwise wait until the deadline.
    ``genrm_poll_s``
        How often a waiting sample looks at its group's progress (5).
    ``genrm_masked_score``
        The score of a masked sample (0.0).
    """

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        kwargs = dict(config.reward.get("reward_kwargs") or {})
        rollout = config.actor_rollout_ref.rollout
        self.target = str(
            kwargs.get("genrm_target") or os.environ.get("GENRM_GRPC_TARGET") or "127.0.0.1:50051"
        )
        self.group_size = int(kwargs.get("genrm_group_size") or rollout.n)
        self.timeout_s = float(kwargs.get("genrm_timeout_s", 3600.0))
        self.sibling_timeout_s = float(kwargs.get("genrm_sibling_timeout_s", 300.0))
        self.poll_s = float(kwargs.get("genrm_poll_s", 5.0))
        self.masked_score = float(kwargs.get("genrm_masked_score", 0.0))
        if self.group_size < 2:
            raise ValueError(
                f"genrm-grpc ranks a sample against its siblings: set "
                f"actor_rollout_ref.rollout.n (or reward.reward_kwargs.genrm_group_size) "
                f">= 2, got {self.group_size}"
            )
        validates = bool(config.trainer.get("val_before_train", True)) or (
            int(config.trainer.get("test_freq", -1)) > 0
        )
        val_n = int(rollout.val_kwargs.n)
        if validates and val_n != self.group_size:
            # verl 0.9 drops the "validate" flag before the reward loop: a validation
            # sample cannot be told from a training sample, so its group size must agree.
            raise ValueError(
                f"genrm-grpc groups validation samples like training samples (verl does "
                f"not tell the reward loop which is which): set "
                f"actor_rollout_ref.rollout.val_kwargs.n={self.group_size} (with "
                f"val_kwargs.do_sample=True), or turn validation off with "
                f"trainer.val_before_train=False trainer.test_freq=-1 "
                f"(val_kwargs.n is {val_n})"
            )
        self._clients: dict[int, CohortClient] = {}

    def _client(self) -> CohortClient:
        # grpc.aio channels belong to the loop that made them: one client per loop.
        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None:
            client = self._clients[id(loop)] = CohortClient(self.target)
        return client

    def member(self, item: Any) -> pb.MemberRef:
        """The sample's MemberRef from its ``uid`` and ``session_id``."""
        fields = item.non_tensor_batch
        if "session_id" not in fields:
            raise ValueError(
                "genrm-grpc needs each sample's position in its group, which verl passes "
                "as session_id only in the V1 trainer: set trainer.use_v1=True"
            )
        uid = str(_plain(fields["uid"]))
        index = int(_plain(fields["session_id"]))
        if not 0 <= index < self.group_size:
            raise ValueError(
                f"sample session_id={index} is outside the group size {self.group_size}: "
                f"per-prompt __rollout_n__ is not supported; set "
                f"reward.reward_kwargs.genrm_group_size to the rollout n"
            )
        return pb.MemberRef(
            group_id=GROUP_PREFIX + uid,
            group_attempt=0,
            rollout_index=index,
            group_size=self.group_size,
        )

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        item = data[-1]  # multi-output agent loops: the last output carries the reward
        member = self.member(item)
        response_ids = item.batch["responses"]
        length = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        ids = response_ids[:length]
        answer = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(ids, skip_special_tokens=True)
        )
        prompt = pb.Prompt(messages=prompt_messages(item.non_tensor_batch["raw_prompt"]))
        result = await self._submit(member, prompt, pb.Candidate(output_text=answer))
        masked = bool(result.mask_sample)
        info: dict[str, Any] = {
            "score": self.masked_score if masked else float(result.reward),
            "genrm_masked": float(masked),
            "genrm_replayed": float(result.replayed),
            "genrm_reward_raw": float(result.reward_score_raw),
        }
        if masked:
            logger.warning(
                "genrm-grpc masked group %s (judge failed: %s): its samples get the neutral "
                "score %s",
                member.group_id,
                result.failure_reason,
                self.masked_score,
            )
        return {"reward_score": info["score"], "reward_extra_info": info}

    async def _submit(
        self, member: pb.MemberRef, prompt: pb.Prompt, candidate: pb.Candidate
    ) -> pb.MemberResult:
        client = self._client()
        call = asyncio.ensure_future(
            client.submit_member(member, prompt, candidate, timeout=self.timeout_s)
        )
        try:
            seen = -1
            progressed = time.monotonic()
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.poll_s)
                if done:
                    return call.result()
                present = await self._present(client, member)
                now = time.monotonic()
                if present is None or present != seen:
                    seen, progressed = (present if present is not None else seen), now
                elif now - progressed >= self.sibling_timeout_s:
                    raise SiblingsStalledError(self._stalled_message(member, present))
        except CohortError as exc:
            raise RuntimeError(
                f"genrm-grpc refused sample {member.rollout_index} of group "
                f"{member.group_id}: {exc}"
            ) from exc
        finally:
            if not call.done():
                call.cancel()

    async def _present(self, client: CohortClient, member: pb.MemberRef) -> int | None:
        """How many samples of the group genrm-grpc holds (None: not known right now)."""
        try:
            info = await client.get_cohort(member.group_id, attempt=0, timeout=10)
        except CohortError:
            return None
        if info.phase != pb.COHORT_PHASE_COLLECTING:
            return None  # judging or done: the outcome is on its way
        return len(info.present_indices)

    def _stalled_message(self, member: pb.MemberRef, present: int) -> str:
        return (
            f"genrm-grpc holds {present} of {self.group_size} samples of group "
            f"{member.group_id} and no other sample arrived for {self.sibling_timeout_s:g} s "
            f"while sample {member.rollout_index} waited. The group is judged only once "
            f"all its samples are submitted, so the missing ones must be able to run while "
            f"these wait: give the reward loop more room (reward.num_workers; Ray's "
            f"max_concurrency of the reward-loop workers), submit every session of a "
            f"prompt (no per-prompt __rollout_n__), and use this async manager, not a "
            f"synchronous compute_score (it holds one thread of a small pool per waiting "
            f"sample). If generation of a prompt's samples really is this far apart, raise "
            f"reward.reward_kwargs.genrm_sibling_timeout_s."
        )
