"""Helpers shared by the client and collector tests: a real server over loopback."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from genrm_grpc.config import load_settings
from genrm_grpc.scoring.extract import extract_texts
from genrm_grpc.server.app import CohortServer
from genrm_grpc.testing import FakeJudgeServer


@asynccontextmanager
async def cohort_server(judge_url: str, port: int = 0, **overrides: Any) -> AsyncIterator[int]:
    """A CohortServer on 127.0.0.1:``port`` (0 = any), stopped on exit; yields the port."""
    settings = load_settings(
        listen=f"127.0.0.1:{port}",
        judge={"url": judge_url},
        genrm_parse_retry_sleep_s=0.01,
        shutdown_grace_s=overrides.pop("shutdown_grace_s", 0.5),
        log_level="WARNING",
        **overrides,
    )
    server = CohortServer(settings)
    bound = await server.start()
    try:
        yield bound
    finally:
        if not server.runtime.draining:
            await server.stop()


def responses_object(answer: str, reasoning: str = "") -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": reasoning}]}
        )
    output.append(
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": answer}],
        }
    )
    return {"object": "response", "status": "completed", "output": output}


def judged_text(response: dict[str, Any]) -> str:
    """The answer text the server sends the judge for a Responses-API object."""
    answer = extract_texts(response).answer
    return answer if answer.strip() else "None"


def prewarm_pairs(judge: FakeJudgeServer, answers: Iterable[str]) -> None:
    """Consume the first request of every ordered pair of these answers at the fake judge.

    With ``fail_400_first_n=1`` the fake judge fails the first request of each answer
    pair; pre-warming the pairs of the groups that should succeed leaves exactly the
    other groups to meet the outage (deterministic per-group fault control).
    """
    texts = list(answers)
    with httpx.Client(base_url=judge.url, timeout=10) as http:
        for first, second in itertools.permutations(texts, 2):
            body = {
                "model": "genrm",
                "input": [{"role": "user", "content": "warm-up"}],
                "metadata": {"response_1": first, "response_2": second},
            }
            http.post("/v1/responses", content=json.dumps(body))


def gym_rows(
    prompt: str,
    answers: list[str],
    *,
    task_index: int | None = None,
    group_id: str | None = None,
    attempt: int | None = None,
    indices: Iterator[int] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for k, answer in enumerate(answers):
        row: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
            "response": responses_object(answer, reasoning=f"thinking about answer {k}"),
            "_ng_rollout_index": next(indices) if indices is not None else k,
        }
        if task_index is not None:
            row["_ng_task_index"] = task_index
        if group_id is not None:
            row["_ng_group_id"] = group_id
        if attempt is not None:
            row["_ng_group_attempt"] = attempt
        rows.append(row)
    return rows


class ClientLog(logging.Handler):
    """The client's log records, with an event per kind of message for waiting tests."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.seen.set()

    def matching(self, text: str) -> list[logging.LogRecord]:
        return [r for r in self.records if text in r.getMessage()]

    async def wait_for(self, text: str) -> logging.LogRecord:
        while not self.matching(text):
            self.seen.clear()
            await self.seen.wait()
        return self.matching(text)[0]


@contextmanager
def capture_client_log() -> Iterator[ClientLog]:
    """The records of logger ``genrm_cohort_client`` (DEBUG and up) while inside."""
    handler = ClientLog()
    logger = logging.getLogger("genrm_cohort_client")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
