"""Assembles and runs the server: judge client, registry, runtime, gRPC, health, reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from genrm_grpc.cohort.registry import CohortRegistry, RegistryConfig
from genrm_grpc.config import Settings
from genrm_grpc.judge.client import JudgeClient, JudgeClientConfig
from genrm_grpc.runtime.engine import CohortRuntime, RuntimeConfig
from genrm_grpc.server.servicer import CohortServicer
from genrm_grpc.store.memory import MemoryStore

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CohortService"].full_name


def judge_client_config(settings: Settings) -> JudgeClientConfig:
    judge = settings.judge
    return JudgeClientConfig(
        url=judge.url,
        api=judge.api,
        model=judge.model,
        max_output_tokens=judge.max_output_tokens,
        temperature=judge.temperature,
        top_p=judge.top_p,
        api_key=judge.api_key(),
        request_timeout_s=settings.judge_request_timeout_s,
        parse_retries=settings.genrm_parse_retries,
        retry_sleep_s=settings.genrm_parse_retry_sleep_s,
        max_retry_sleep_s=judge.max_retry_sleep_s,
        default_score=settings.default_score,
        default_ranking=settings.default_ranking,
        max_connections=judge.max_connections,
    )


class CohortServer:
    """One running server. ``start()`` binds; ``stop()`` drains and shuts down."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.judge = JudgeClient(judge_client_config(settings))
        store = MemoryStore(
            ttl_s=settings.cohort_result_ttl_s, max_records=settings.max_terminal_cohorts
        )
        self.registry = CohortRegistry(
            RegistryConfig(
                collection_timeout_s=settings.cohort_collection_timeout_s,
                evaluation_timeout_s=settings.cohort_evaluation_timeout_s,
                max_active_cohorts=settings.max_active_cohorts,
            ),
            store,
        )
        self.runtime = CohortRuntime(
            self.registry,
            self.judge,
            RuntimeConfig(
                comparison_mode=settings.comparison_mode,
                judge_schedule=settings.judge_schedule,
                judge_max_concurrency=settings.judge_max_concurrency,
                use_principle=settings.use_principle,
                default_principle=settings.default_principle,
                position_debias=settings.position_debias,
                scoring=settings.scoring_params(),
            ),
        )
        # gRPC's own hard limit sits above ours so oversized members get our typed error.
        hard_limit = settings.max_message_bytes * 2 + (1 << 20)
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", hard_limit),
                ("grpc.max_send_message_length", hard_limit),
            ]
        )
        pb_grpc.add_CohortServiceServicer_to_server(
            CohortServicer(
                self.runtime,
                default_group_size=settings.num_rollouts_per_prompt,
                mode=settings.comparison_mode,
                max_message_bytes=settings.max_message_bytes,
            ),
            self.server,
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = 0

    async def start(self) -> int:
        self.port = self.server.add_insecure_port(self.settings.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.settings.listen}")
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"listen": self.settings.listen, "port": self.port})
        return self.port

    async def stop(self) -> None:
        """Health → NOT_SERVING, refuse new cohorts, let evaluations finish, fail the rest."""
        log.info("draining", extra={"grace_s": self.settings.shutdown_grace_s})
        await self.health.enter_graceful_shutdown()
        await self.runtime.shutdown(self.settings.shutdown_grace_s)
        # Give handlers a moment to send the outcomes that shutdown just published.
        await self.server.stop(grace=5.0)
        await self.judge.aclose()
        log.info("stopped")


async def run(settings: Settings, *, on_ready: Callable[[int], None] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers first: a SIGTERM right after the readiness line must still drain cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = CohortServer(settings)
    try:
        port = await server.start()
        if on_ready is not None:
            on_ready(port)
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
