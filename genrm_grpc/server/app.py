"""Assembles and runs the server: judge client, runtime, gRPC, health, reflection.

Where it listens and with which gRPC options is ``server/listen.py`` (re-exported here).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from genrm.cohort.v1 import cohort_pb2 as pb
from genrm.cohort.v1 import cohort_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from genrm_grpc.config import ConfigError, Settings
from genrm_grpc.judge.client import JudgeClient
from genrm_grpc.judge.prober import FarmProber
from genrm_grpc.judge.readiness import JudgeMonitor, JudgeReadiness
from genrm_grpc.observability.hooks import (
    FanoutJudgeObserver,
    FanoutRuntimeObserver,
    JudgeObserver,
    RuntimeObserver,
)
from genrm_grpc.observability.metrics import MetricsEndpoint, ServerMetrics
from genrm_grpc.runtime.clock import LoopClock, WallClock
from genrm_grpc.runtime.group_store import GroupStore
from genrm_grpc.runtime.live import JudgeBackend, Runtime
from genrm_grpc.runtime.replica import ReplicaRuntime
from genrm_grpc.server.admission import Admission
from genrm_grpc.server.bounds import FieldBounds
from genrm_grpc.server.documented_reflection import enable_documented_reflection
from genrm_grpc.server.interceptors import UndecodableRequestInterceptor
from genrm_grpc.server.listen import (
    KEEPALIVE_OPTIONS,
    ListenError,
    check_listen,
    server_options,
)
from genrm_grpc.server.overload import ConcurrentCallLimit
from genrm_grpc.server.security import Principals, TokenAuthInterceptor, server_credentials
from genrm_grpc.server.servicer import CohortServicer
from genrm_grpc.store.durable import store_from_url
from genrm_grpc.store.local import LocalGroups

if TYPE_CHECKING:
    from genrm_grpc.observability.tracing import Tracing

__all__ = [
    "FLUSH_S",
    "KEEPALIVE_OPTIONS",
    "SERVICE_NAME",
    "CohortServer",
    "ListenError",
    "check_listen",
    "freeze_startup_state",
    "judge_identity",
    "run",
    "server_options",
]

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CohortService"].full_name


def judge_identity(settings: Settings) -> dict[str, object]:
    """The judge settings that can change a verdict (part of each journaled pass's
    context; the URL is not: replicas of one model behind other addresses agree)."""
    judge = settings.judge
    return {
        "api": judge.api,
        "model": judge.model,
        "max_output_tokens": judge.max_output_tokens,
        "temperature": judge.temperature,
        "top_p": judge.top_p,
        "default_score": settings.default_score,
        "default_ranking": settings.default_ranking,
    }


#: After the runtime published every outcome of the drain, how long handlers get to
#: write them before the remaining calls are cancelled.
FLUSH_S = 5.0


class CohortServer:
    """One running server. ``start()`` binds; ``stop()`` drains and shuts down."""

    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: Any = None,
        judge_backend: JudgeBackend | None = None,
    ) -> None:
        """``tracer_provider`` (an OpenTelemetry SDK TracerProvider) replaces the one that
        ``tracing.exporter`` would build; it is used only when tracing is enabled.
        ``judge_backend`` decides the verdicts in place of the HTTP judge client (the
        in-process benchmarks measure the service's own work with an instant judge);
        the client still exists for probes and metrics."""
        self.settings = settings
        self.metrics = ServerMetrics()
        self.tracing: Tracing | None = None
        judge_observer: JudgeObserver = self.metrics
        runtime_observer: RuntimeObserver = self.metrics
        if settings.tracing.enabled:
            self.tracing = _tracing(settings, tracer_provider)
            judge_observer = FanoutJudgeObserver(self.metrics, self.tracing)
            runtime_observer = FanoutRuntimeObserver(self.metrics, self.tracing)
        self._judge_ready = True
        self._store_ready = True
        self._build_judge(judge_observer)
        self._judge_monitor_task: asyncio.Task[None] | None = None
        self._farm_task: asyncio.Task[None] | None = None
        self._discovery_task: asyncio.Task[None] | None = None
        # Every component reads its own scoped view of the one Settings: nothing copied.
        self.runtime = self._build_runtime(judge_backend or self.judge, runtime_observer)
        self.metrics.attach_runtime(self.runtime)
        self.metrics.attach_farm(self.judge.farm)
        self.metrics.attach_tokens(self.judge.tokens, self.judge.budget)
        self.call_limit = ConcurrentCallLimit(
            settings.max_concurrent_rpcs, on_refused=self.metrics.calls_refused_overloaded.inc
        )
        self.metrics.calls_in_progress.set_function(lambda: self.call_limit.in_progress)
        self.server = grpc.aio.server(
            interceptors=self._interceptors(), options=server_options(settings)
        )
        self.admission = _admission(settings)
        self.servicer = CohortServicer(
            self.runtime, self.admission, observer=self.metrics, tracer=self.tracing
        )
        pb_grpc.add_CohortServiceServicer_to_server(self.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # Reflection that also serves the proto comments (grpcurl describe shows them).
        enable_documented_reflection((SERVICE_NAME, health.SERVICE_NAME), self.server)
        self.metrics_endpoint: MetricsEndpoint | None = None
        if settings.metrics_listen is not None:
            self.metrics_endpoint = MetricsEndpoint(
                self.metrics.exposition, settings.metrics_listen
            )
        self.port = 0
        self._stopping: asyncio.Task[None] | None = None

    def _build_judge(self, observer: JudgeObserver) -> None:
        """The judge client and what watches it: readiness, its monitor, the farm prober
        and, with ``discovery: dns``, the discovery that keeps the farm's URLs."""
        settings = self.settings
        self.judge_readiness = JudgeReadiness(settings.judge_unreachable_window_s)
        self.judge = JudgeClient(
            settings,
            observer=observer,
            reachability=self.judge_readiness,
            on_hedge=self.metrics.judge_hedged,
        )
        self.judge_monitor = JudgeMonitor(
            self.judge,
            self.judge_readiness,
            probe=settings.judge_probe,
            probe_timeout_s=settings.judge_probe_timeout_s,
            on_change=self._judge_readiness_changed,
        )
        self.farm_prober = FarmProber(
            self.judge,
            self.judge_readiness,
            probe_interval_s=settings.judge.probe_interval_s,
            probe_timeout_s=settings.judge_probe_timeout_s,
            scrape_metrics_s=settings.judge.scrape_metrics_s,
        )
        self.discovery: Any = None  # a judge.discovery.DnsDiscovery with discovery: dns
        if settings.judge.discovery == "dns":
            # Imported here: dnspython is needed only with DNS discovery.
            from genrm_grpc.judge.discovery import DnsDiscovery

            self.discovery = DnsDiscovery(
                settings.judge.url,
                interval_s=settings.judge.discovery_interval_s,
                on_change=self.judge.farm.set_urls,
                nameserver=settings.judge.discovery_nameserver,
            )

    def _build_runtime(self, backend: JudgeBackend, observer: RuntimeObserver) -> Runtime:
        """The one runtime, over the group store the configured store calls for: Redis
        shared by replicas, or the in-process store of a single process (the one-replica
        case) with the SQLite file, or nothing, behind it."""
        settings = self.settings
        store = store_from_url(settings.store, max_tombstones=settings.max_terminal_cohorts)
        redis = settings.store.startswith("redis:")
        # Wall-clock seconds: what replicas sharing Redis compare, and the in-process
        # store's deadline timers count in the same clock as its runtime. Its leases
        # count in the loop's monotonic clock, which no step of the wall clock moves.
        clock = WallClock()
        shared: GroupStore
        if redis:
            # Replicas sharing one Redis (docs/scaling.md); imported here so that a server
            # on a file or in memory never loads the Redis client.
            from genrm_grpc.store.redis import RedisStore
            from genrm_grpc.store.shared import SharedGroups

            assert isinstance(store, RedisStore)
            on_redis = SharedGroups(store, lease_s=settings.replica_lease_s)
            on_redis.on_round_trip = self.metrics.store_round_trip.observe
            shared = on_redis
        else:
            # One process deciding as the one replica of its deployment,
            # with the SQLite file behind its group store, or nothing (memory://).
            shared = LocalGroups(
                settings,
                lease_s=settings.replica_lease_s,
                behind=store if store.survives_restart else None,
                address=settings.store,
                clock=clock,
                lease_clock=LoopClock(),
            )
        return ReplicaRuntime(
            backend,
            settings,
            shared=shared,
            observer=observer,
            judge_identity=judge_identity(settings),
            on_store_health=self._store_health_changed,
            clock=clock,
        )

    def _interceptors(self) -> list[Any]:
        """Outermost first: tracing, bearer auth, the concurrent-call limit, decoding."""
        interceptors: list[Any] = []
        if self.tracing is not None:
            from genrm_grpc.observability.tracing import TracingInterceptor

            # First, so that refused calls are traced too.
            interceptors.append(TracingInterceptor(self.tracing.tracer))
        if self.settings.auth is not None:
            interceptors.append(
                TokenAuthInterceptor(
                    self.settings.auth.tokens(), on_denied=self.metrics.auth_denied
                )
            )
        # After auth: an unauthenticated call is refused as such, and never counted.
        interceptors.append(self.call_limit)
        # Last: the innermost, so a refused caller learns nothing from undecodable bytes.
        interceptors.append(UndecodableRequestInterceptor())
        return interceptors

    async def start(self) -> int:
        """Bind and start; a busy or foreign address raises :class:`ListenError`, a store
        this server cannot use :class:`StoreSchemaError` (before anything is served)."""
        listen, tls = self.settings.listen, self.settings.tls
        check_listen(listen, reuse_port=self.settings.listen_reuse_port)
        if self.settings.metrics_listen is not None:
            check_listen(self.settings.metrics_listen, reuse_port=False, what="metrics_listen")
        if self.discovery is not None:
            # The farm starts from what the name resolves to now (unresolvable: the URL
            # as configured, re-resolved every discovery_interval_s).
            await self.discovery.refresh()
        if self.settings.judge_probe == "startup":
            # Every endpoint's /v1/models: a model no endpoint serves would mask every
            # group, so it stops the start (endpoints that are down are probed later).
            check = await self.judge.check_models(self.settings.judge_probe_timeout_s)
            if check.fatal:
                await self.judge.aclose()
                raise ConfigError(check.summary())
        # The store first: cohorts it holds resume before the first call is taken.
        await self.runtime.open()
        try:
            if tls is not None:
                self.port = self.server.add_secure_port(listen, server_credentials(tls))
            else:
                self.port = self.server.add_insecure_port(listen)
        except RuntimeError as exc:  # newer grpcio raises instead of returning 0
            raise ListenError(f"cannot listen on {listen}: {exc}") from exc
        if self.port == 0:
            raise ListenError(f"cannot listen on {listen}")
        if self.metrics_endpoint is not None:
            try:
                await self.metrics_endpoint.start()
            except OSError as exc:
                reason = (exc.strerror or str(exc)).lower()
                raise ListenError(
                    f"cannot listen on {self.settings.metrics_listen} (metrics_listen): {reason}"
                ) from None
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._judge_monitor_task = asyncio.create_task(
            self.judge_monitor.run(), name="judge-monitor"
        )
        self._farm_task = asyncio.create_task(self.farm_prober.run(), name="judge-farm")
        if self.discovery is not None:
            self._discovery_task = asyncio.create_task(self.discovery.run(), name="judge-discovery")
        log.info(
            "serving",
            extra={
                "listen": listen,
                "port": self.port,
                "tls": "off" if tls is None else "mtls" if tls.require_client_auth else "on",
                "auth": "off" if self.settings.auth is None else "bearer",
                "metrics_port": self.metrics_port,
                "instance": self.servicer.instance_id,
            },
        )
        return self.port

    async def _judge_readiness_changed(self, ready: bool) -> None:
        self.metrics.judge_readiness(ready)
        self._judge_ready = ready
        await self._set_readiness()

    async def _store_health_changed(self, available: bool) -> None:
        """A shared store (Redis) went down or came back."""
        self.metrics.store_availability(available)
        self._store_ready = available
        await self._set_readiness()

    async def _set_readiness(self) -> None:
        # Only the cohort service: overall health ("") stays SERVING for liveness probes.
        if self._stopping is not None:
            return  # draining: NOT_SERVING for good
        ready = self._judge_ready and self._store_ready
        status = health_pb2.HealthCheckResponse
        await self.health.set(SERVICE_NAME, status.SERVING if ready else status.NOT_SERVING)

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port (None when the endpoint is off)."""
        return self.metrics_endpoint.port if self.metrics_endpoint is not None else None

    async def close_unstarted(self) -> None:
        """Release what ``__init__`` and a failed ``start()`` took, without a drain."""
        await self.server.stop(None)
        await self.runtime.shutdown(0)
        await self.runtime.close()
        await self.judge.aclose()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        if self.tracing is not None:
            self.tracing.shutdown()

    async def stop(self) -> None:
        """Drain and stop; idempotent: a second call waits for the same drain.

        Health turns NOT_SERVING and gRPC sends GOAWAY at once (clients open new calls
        elsewhere; the listener is closed), evaluating cohorts may finish within
        ``shutdown_grace_s``, then everything still active fails with a typed status,
        and handlers get ``FLUSH_S`` to write what was published.
        """
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    def hurry(self) -> None:
        """End the drain's grace period now (a second SIGTERM/SIGINT): an orderly stop."""
        log.warning("second signal: ending the shutdown grace period now")
        self.runtime.end_grace()

    async def _stop(self) -> None:
        grace = self.settings.shutdown_grace_s
        log.info("draining", extra={"grace_s": grace})
        if self._judge_monitor_task is not None:
            # First, so that it cannot set the cohort service SERVING while draining.
            self._judge_monitor_task.cancel()
            await asyncio.gather(self._judge_monitor_task, return_exceptions=True)
        for task in (self._farm_task, self._discovery_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.health.enter_graceful_shutdown()
        # server.stop refuses new calls and sends GOAWAY now; calls in flight get the
        # grace plus FLUSH_S, and it returns as soon as the last one has finished.
        stopping = asyncio.ensure_future(self.server.stop(grace=grace + FLUSH_S))
        await self.runtime.shutdown(grace)
        await stopping
        await self.runtime.close()
        await self.judge.aclose()
        if self.metrics_endpoint is not None:
            await self.metrics_endpoint.stop()
        if self.tracing is not None:
            self.tracing.shutdown()  # flushes the exporter
        log.info("stopped")


def _tracing(settings: Settings, provider: Any) -> Tracing:
    try:
        from genrm_grpc.observability.tracing import Tracing, build_provider
    except ImportError as exc:
        raise ConfigError(
            f"tracing.enabled needs the [otel] extra (pip install 'genrm-grpc[otel]'): {exc}"
        ) from exc
    return Tracing(provider if provider is not None else build_provider(settings.tracing))


def _admission(settings: Settings) -> Admission:
    """The checks every call passes before the runtime sees it, from the settings."""
    return Admission(
        default_group_size=settings.num_rollouts_per_prompt,
        mode=settings.comparison_mode,
        max_message_bytes=settings.max_message_bytes,
        max_call_wait_s=settings.max_call_wait_s,
        stream_limits=settings,
        pass_count=settings.pass_plan().pass_count,
        bounds=FieldBounds(settings),
        principals=Principals(
            settings.auth.principals() if settings.auth is not None else None,
            certificates=settings.tls is not None and settings.tls.client_ca_file is not None,
        ),
        max_compare_passes_per_principal=settings.max_compare_passes_per_principal,
    )


#: The cyclic GC's youngest-generation threshold while serving (CPython's default: 700).
#: A call's objects live until its commit is written, so with 128 calls in flight nearly
#: every object a young collection finds is alive, and it is walked again in the middle
#: generation: at 700, a 1-member SubmitMember on the SQLite store spent ~13 µs of the
#: event loop's time per member in collections; at 10,000, most of what a collection
#: would have walked has been freed by its reference count first (~2 µs). Nothing here
#: relies on the GC to free memory (an in-process run leaves no cyclic garbage), and a
#: young collection of 10,000 objects takes about a millisecond.
SERVING_GC_THRESHOLD = (10_000, 10, 10)


def freeze_startup_state() -> int:
    """Move everything alive after start-up (modules, classes, the server's own objects)
    into the GC's permanent generation, so full collections stop walking it, and set
    :data:`SERVING_GC_THRESHOLD`; returns how many objects are frozen. Retained
    tombstones need no freezing: the store keeps them as untracked bytes (see
    MemoryStore). Later objects are not frozen on purpose: a frozen object that later
    dies in a reference cycle would never be freed."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLD)
    return gc.get_freeze_count()


async def run(settings: Settings, *, on_ready: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain. A second signal ends the grace period.

    The handlers stay installed until the drain is over: a repeated signal never falls
    through to the default action (killing the process mid-drain); every waiting call
    still gets a typed status and the exit code stays 0.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    server = CohortServer(settings)

    def on_signal() -> None:
        if stop.is_set():
            server.hurry()
        stop.set()

    # Handlers first: a SIGTERM right after the readiness line must still drain cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        port = await server.start()
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.close_unstarted()
        raise
    try:
        freeze_startup_state()
        if on_ready is not None:
            on_ready(port)
        await stop.wait()
    finally:
        try:
            await server.stop()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
