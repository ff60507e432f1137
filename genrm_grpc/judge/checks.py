"""What the judge client asks an endpoint outside comparisons: is it up, which models
does it serve, is it fit to take work again.

``EndpointChecks`` is a part of ``JudgeClient`` (which inherits it): the readiness
probe (``GET /v1/models`` to every endpoint), the start-up model check and the
prober's readmission check (``GET /health`` then ``/v1/models``). None of them raises.
"""

from __future__ import annotations

import asyncio

from genrm_grpc.judge.attempts import OUTAGE_STATUSES
from genrm_grpc.judge.farm import Endpoint, EndpointState, Farm
from genrm_grpc.judge.transport import READ_CHUNK, Transport
from genrm_grpc.judge.types import ModelCheck, ModelsAnswer, ProbeResult
from genrm_grpc.judge.views import JudgeView
from genrm_grpc.judge.wire import decode_json

_MODELS_BYTES = 1024 * 1024
"""How much of a ``/v1/models`` answer is read."""


class EndpointChecks:
    """The endpoint checks of a ``JudgeClient``, over its transport and farm."""

    _config: JudgeView
    _transport: Transport
    farm: Farm

    async def probe(self, timeout_s: float) -> ProbeResult:
        """One cheap request (``GET /v1/models``) to every endpoint, bounded by ``timeout_s``.

        Reachable means some endpoint answered HTTP with anything but 502/503/504 (a 404
        from a server without ``/v1/models`` still shows it is up). Never raises.
        """
        endpoints = [e for e in self.farm.endpoints if e.state is not EndpointState.DRAINING]
        results = await asyncio.gather(*(self._probe_one(e, timeout_s) for e in endpoints))
        if not any(e.takes_work for e in endpoints):
            # Answering is not enough: ejected or not serving the model, none can judge.
            states = "; ".join(f"{e.display} {e.state}: {e.detail}" for e in endpoints)
            return ProbeResult(False, f"no judge endpoint is healthy: {states}")
        if len(results) == 1:
            return results[0]
        working = zip(endpoints, results, strict=True)
        reachable = any(r.reachable for e, r in working if e.takes_work)
        detail = "; ".join(
            f"{e.display}: {r.detail}" for e, r in zip(endpoints, results, strict=True)
        )
        return ProbeResult(reachable, detail)

    async def _probe_one(self, endpoint: Endpoint, timeout_s: float) -> ProbeResult:
        status, _ = await self.get(endpoint, "/v1/models", timeout_s)
        if isinstance(status, str):
            return ProbeResult(False, status)
        if status in OUTAGE_STATUSES:
            return ProbeResult(False, f"HTTP {status}")
        return ProbeResult(True, f"HTTP {status}")

    async def get(
        self, endpoint: Endpoint, path: str, timeout_s: float, *, limit: int = READ_CHUNK
    ) -> tuple[int | str, bytes]:
        """``GET`` a path of the endpoint: (status, first ``limit`` bytes), or (why, b"")."""
        return await self._transport.get(endpoint, path, timeout_s, limit=limit)

    async def models(self, endpoint: Endpoint, timeout_s: float) -> ModelsAnswer:
        """What ``GET /v1/models`` of one endpoint says about ``judge.model``."""
        status, raw = await self.get(endpoint, "/v1/models", timeout_s, limit=_MODELS_BYTES)
        if isinstance(status, str):
            return ModelsAnswer("unreachable", (), status)
        if status == 404:
            return ModelsAnswer("unknown", (), "no /v1/models (HTTP 404)")
        if status != 200:
            return ModelsAnswer("unreachable", (), f"/v1/models: HTTP {status}")
        try:
            body = decode_json(raw)
            names = tuple(str(m["id"]) for m in body["data"] if isinstance(m, dict) and "id" in m)
        except (ValueError, KeyError, TypeError):
            return ModelsAnswer("unknown", (), "/v1/models answered no model list")
        if self._config.judge.model in names:
            return ModelsAnswer("served", names, "serves the model")
        return ModelsAnswer("not_served", names, "serves " + (", ".join(names) or "no model"))

    async def check_models(self, timeout_s: float) -> ModelCheck:
        """Start-up: ask every endpoint; those that answer without the model are out."""
        endpoints = list(self.farm.endpoints)
        answers = await asyncio.gather(*(self.models(e, timeout_s) for e in endpoints))
        for endpoint, answer in zip(endpoints, answers, strict=True):
            if answer.state == "not_served":
                self.farm.wrong_model(endpoint, self.not_served(answer))
        return ModelCheck(self._config.judge.model, tuple(zip(endpoints, answers, strict=True)))

    def not_served(self, answer: ModelsAnswer) -> str:
        model = self._config.judge.model
        return f"does not serve judge.model {model!r} ({answer.detail})"

    async def health(self, endpoint: Endpoint, timeout_s: float) -> str | None:
        """Readmission probe: None when the endpoint is fit for work, else why not.

        ``GET /health`` first (vLLM answers it from its engine: a hung engine fails it
        while ``/v1/models`` still answers); 404 there means a server without it. Then
        ``/v1/models`` must list the model (or not exist).
        """
        status, _ = await self.get(endpoint, "/health", timeout_s)
        if isinstance(status, str):
            return f"/health: {status}"
        if status != 404 and not 200 <= status <= 299:
            return f"/health: HTTP {status}"
        answer = await self.models(endpoint, timeout_s)
        if answer.state == "unreachable":
            return answer.detail
        if answer.state == "not_served":
            return self.not_served(answer)
        return None
