"""A live stack for the Gym tests: fake judge + genrm-grpc (subprocesses) + this server.

The resources server is Gym's own ``SimpleResourcesServer`` machinery: the FastAPI app
from ``setup_webserver`` with Gym's exception middleware, served by uvicorn on a real
loopback socket; requests cross real HTTP, then real gRPC, then the fake judge's HTTP.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient
from omegaconf import OmegaConf

from genrm_grpc.demo import running_stack
from genrm_grpc_compare.app import GenRMGrpcCompareConfig, GenRMGrpcCompareResourcesServer

GROUP_SIZE = 4


@dataclass
class Stack:
    judge_url: str
    target: str
    http: httpx.AsyncClient
    server: GenRMGrpcCompareResourcesServer

    def judge_stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.judge_url}/stats", timeout=10) as reply:
            stats: dict[str, Any] = json.load(reply)
        return stats

    def judge_faults(self, **changes: Any) -> None:
        request = urllib.request.Request(
            f"{self.judge_url}/faults",
            data=json.dumps(changes).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def judge_reset_stats(self) -> None:
        request = urllib.request.Request(f"{self.judge_url}/stats/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    async def verify(self, payload: dict[str, Any]) -> tuple[int, Any]:
        reply = await self.http.post("/verify", json=payload)
        return reply.status_code, reply.json()


@pytest.fixture(scope="module", autouse=True)
def _store_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """genrm-grpc keeps its state in a SQLite file (default: in the working directory);
    the servers these tests start use one under a temporary directory instead."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("store") / "genrm-state.sqlite3"
        patch.setenv("GENRM_STORE", f"sqlite:///{path}")
        yield


@pytest.fixture(scope="module")
def grpc_stack(_store_file: None) -> Iterator[tuple[str, str]]:
    with running_stack(["--num-rollouts-per-prompt", str(GROUP_SIZE)]) as stack:
        yield stack


@pytest.fixture
async def stack(grpc_stack: tuple[str, str]) -> AsyncIterator[Stack]:
    judge_url, target = grpc_stack
    config = GenRMGrpcCompareConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name="genrm_grpc_compare",
        grpc_target=target,
        num_rollouts_per_prompt=GROUP_SIZE,
        verify_timeout_s=60,
        compare_timeout_s=60,
    )
    server_client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict=OmegaConf.create({}),
    )
    server = GenRMGrpcCompareResourcesServer(config=config, server_client=server_client)
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not uv.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            s = Stack(judge_url, target, http, server)
            s.judge_faults(fail_503_rate=0.0, retry_after_s=None)
            yield s
    finally:
        uv.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()
