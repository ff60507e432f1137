"""Baselines for the multi-process benchmark: the physical limit of the same work.

``python -m bench.baseline --mode judge`` is a bare ``grpc.aio`` servicer of the same
``CohortService`` proto. It keeps the members of each group in a dict; when a group is
complete it sends the judge the same HTTP requests as the service (circular pairs, the
same JSON bodies: conversation, ``metadata.response_1/2``, principle, model), at most
``--concurrency`` at a time, with one shared aiohttp session; it reads the verdict block
from each answer and then answers every member with a ``MemberResult`` (reward = mean of
its scores, its two comparisons). ``StreamGroups`` sends what the service sends:
``accepted`` per member, ``pair_judged`` per verdict, ``result`` per member.

``--mode echo`` answers each member at once (``SubmitMember``: a result;
``StreamGroups``: ``accepted`` then ``result``): a bare echo of the proto.

No validation, digests, registry, deadlines, retries, metrics or fencing: everything the
service does beyond this is its overhead. Prints ``bench-baseline serving on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc

_VERDICT = re.compile(r"```json\s*(\{.*?\})\s*```", re.S)
DEFAULT_REWARD = 3.5


@dataclass(slots=True)
class Group:
    size: int
    request: pb.SubmitMemberRequest
    members: dict[int, pb.SubmitMemberRequest] = field(default_factory=dict)
    done: asyncio.Future[list[pb.MemberResult]] | None = None
    #: StreamGroups listeners: called with every PairJudged as it arrives.
    progress: list[Any] = field(default_factory=list)


class Baseline(pb_grpc.CohortServiceServicer):  # type: ignore[misc]
    def __init__(self, args: argparse.Namespace) -> None:
        self.echo = args.mode == "echo"
        self.api = args.api
        base = args.judge_url.rstrip("/").removesuffix("/v1")
        path = "/v1/responses" if self.api == "responses" else "/v1/chat/completions"
        self.endpoint = base + path
        self.model = args.model
        self.principle = args.principle
        self.default_size = args.group_size
        self.concurrency = args.concurrency
        self.groups: dict[tuple[str, int], Group] = {}
        self.session: aiohttp.ClientSession | None = None
        self.sem = asyncio.Semaphore(args.concurrency)
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency)
        self.session = aiohttp.ClientSession(connector=connector)

    # ---------------------------------------------------------------- the judge work
    def body(self, group: Group, i: int, j: int) -> dict[str, Any]:
        prompt = group.request.prompt
        conversation = [{"role": m.role, "content": m.content} for m in prompt.messages]
        first = group.members[i].candidate.output_text
        second = group.members[j].candidate.output_text
        principle = prompt.principle or self.principle
        if self.api == "responses":
            metadata = {"response_1": first or "None", "response_2": second or "None"}
            if principle:
                metadata["principle"] = principle
            return {"model": self.model, "input": conversation, "metadata": metadata}
        messages = list(conversation)
        if principle:
            messages.append({"role": "principle", "content": principle})
        messages.append({"role": "response_1", "content": first or "None"})
        messages.append({"role": "response_2", "content": second or "None"})
        return {"model": self.model, "messages": messages}

    async def judge_pair(self, group: Group, i: int, j: int) -> tuple[float, float]:
        assert self.session is not None
        async with self.sem, self.session.post(self.endpoint, json=self.body(group, i, j)) as resp:
            answer = await resp.json()
        if self.api == "responses":
            text = "".join(
                part["text"]
                for item in answer["output"]
                if item.get("type") == "message"
                for part in item["content"]
                if part.get("type") == "output_text"
            )
        else:
            text = answer["choices"][0]["message"]["content"]
        found = _VERDICT.search(text)
        verdict = json.loads(found.group(1)) if found else {"score_1": 3.0, "score_2": 3.0}
        for listener in group.progress:
            listener(i, j)
        return float(verdict["score_1"]), float(verdict["score_2"])

    async def evaluate(self, key: tuple[str, int], group: Group) -> None:
        assert group.done is not None
        n = group.size
        pairs = [(i, (i + 1) % n) for i in range(n)] if n >= 2 else []
        try:
            verdicts = await asyncio.gather(*(self.judge_pair(group, i, j) for i, j in pairs))
        except Exception as exc:  # the harness reports it; the members see an error
            group.done.set_exception(exc)
            return
        finally:
            self.groups.pop(key, None)
        scores: list[list[float]] = [[] for _ in range(n)]
        comparisons: list[list[pb.PairVerdict]] = [[] for _ in range(n)]
        for (i, j), (s1, s2) in zip(pairs, verdicts, strict=True):
            scores[i].append(s1)
            scores[j].append(s2)
            verdict = pb.PairVerdict(
                response_i=i, response_j=j, score_1=s1, score_2=s2, ranking=3.0
            )
            comparisons[i].append(verdict)
            comparisons[j].append(verdict)
        results = []
        for k in range(n):
            reward = sum(scores[k]) / len(scores[k]) if scores[k] else DEFAULT_REWARD
            results.append(
                pb.MemberResult(
                    member=group.members[k].member,
                    reward=reward,
                    reward_score_raw=reward,
                    reward_overall_score_raw=reward,
                    reward_overall_score=reward,
                    comparisons=comparisons[k],
                    group_metrics={"mean_individual_score": reward},
                )
            )
        group.done.set_result(results)

    def join(self, request: pb.SubmitMemberRequest) -> tuple[Group, int]:
        ref = request.member
        key = (ref.group_id, ref.group_attempt)
        group = self.groups.get(key)
        if group is None:
            size = ref.group_size or self.default_size
            group = Group(size=size, request=request)
            group.done = asyncio.get_running_loop().create_future()
            self.groups[key] = group
        group.members[ref.rollout_index] = request
        if len(group.members) == group.size:
            task = asyncio.ensure_future(self.evaluate(key, group))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return group, ref.rollout_index

    def echo_result(self, request: pb.SubmitMemberRequest) -> pb.MemberResult:
        return pb.MemberResult(
            member=request.member,
            reward=DEFAULT_REWARD,
            reward_score_raw=DEFAULT_REWARD,
            reward_overall_score_raw=DEFAULT_REWARD,
            reward_overall_score=DEFAULT_REWARD,
        )

    # ---------------------------------------------------------------- the two RPCs
    async def SubmitMember(
        self, request: pb.SubmitMemberRequest, context: Any
    ) -> pb.SubmitMemberResponse:
        if self.echo:
            return pb.SubmitMemberResponse(result=self.echo_result(request))
        group, index = self.join(request)
        assert group.done is not None
        results = await asyncio.shield(group.done)
        return pb.SubmitMemberResponse(result=results[index])

    async def StreamGroups(
        self, requests: AsyncIterator[pb.StreamGroupsRequest], context: Any
    ) -> AsyncIterator[pb.StreamGroupsResponse]:
        queue: asyncio.Queue[pb.StreamGroupsResponse | None] = asyncio.Queue()
        put = queue.put_nowait
        waits: set[asyncio.Task[None]] = set()

        async def wait(group: Group, index: int) -> None:
            assert group.done is not None
            results = await asyncio.shield(group.done)
            put(pb.StreamGroupsResponse(result=results[index]))

        async def read() -> None:
            async for request in requests:
                member = request.member
                put(pb.StreamGroupsResponse(accepted=pb.MemberAccepted(member=member.member)))
                if self.echo:
                    put(pb.StreamGroupsResponse(result=self.echo_result(member)))
                    continue
                group, index = self.join(member)
                if not group.progress:
                    ref = member.member

                    def progress(i: int, j: int, ref: pb.MemberRef = ref) -> None:
                        put(
                            pb.StreamGroupsResponse(
                                pair_judged=pb.PairJudged(member=ref, response_i=i, response_j=j)
                            )
                        )

                    group.progress.append(progress)
                task = asyncio.ensure_future(wait(group, index))
                waits.add(task)
            await asyncio.gather(*waits)
            put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            reader.cancel()


async def serve(args: argparse.Namespace) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_concurrent_streams", 4096),
            ("grpc.max_receive_message_length", 16 * 2**20),
        ]
    )
    servicer = Baseline(args)
    await servicer.start()
    pb_grpc.add_CohortServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    print(f"bench-baseline serving on {args.host}:{port}", flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline", description=__doc__)
    parser.add_argument("--mode", choices=("judge", "echo"), default="judge")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--judge-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api", choices=("responses", "chat_completions"), default="responses")
    parser.add_argument("--model", default="genrm")
    parser.add_argument("--principle", default="")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
