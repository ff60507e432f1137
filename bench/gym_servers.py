"""NeMo Gym servers of the "vs NeMo Gym genrm_compare" section, one per process.

Runs under the Gym venv (``integrations/nemo_gym/gym-env.sh``), with this checkout and
``clients/python`` on ``PYTHONPATH``::

    python -m bench.gym_servers model --judge-url URL --model NAME
    python -m bench.gym_servers genrm_compare --model-port PORT --size 16 --principle TEXT
    python -m bench.gym_servers genrm_grpc_compare --grpc-target HOST:PORT --size 16

Each builds the FastAPI app with Gym's own ``setup_webserver``, ``setup_liveness`` and
``setup_exception_middleware``, serves it with uvicorn on a free loopback port and prints
``serving on 127.0.0.1:PORT`` (what :class:`bench.launch.Proc` waits for).

``model`` is Gym's GenRM model server logic (``GenRMModelMixin``: the pair goes to the
judge as ``response_1``/``response_2``/``principle`` messages) on Gym's ``VLLMModel``,
which calls ``/v1/chat/completions`` of an already running server. Gym's own
``GenRMModel`` starts vLLM itself (downloads a model, Ray), which this machine cannot do;
the mixin and the HTTP client are the same code. ``genrm_compare`` is the resources
server of the installed nemo-gym release, unchanged, calling that model server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from typing import Any

import uvicorn
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient
from omegaconf import OmegaConf

MODEL_SERVER = "genrm_model"


def _server_client(model_port: int | None) -> ServerClient:
    servers: dict[str, Any] = {}
    if model_port is not None:
        # The shape Gym's global config gives a model server: NAME → type → NAME → address.
        servers[MODEL_SERVER] = {
            "responses_api_models": {MODEL_SERVER: {"host": "127.0.0.1", "port": model_port}}
        }
    return ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
        global_config_dict=OmegaConf.create(servers),
    )


def _genrm_model_mixin() -> Any:
    """Gym's ``GenRMModelMixin``, imported without vLLM.

    ``responses_api_models.genrm_model.app`` imports ``local_vllm_model.app`` (for the
    base classes of ``GenRMModel``, which launches vLLM in-process), and that imports the
    ``vllm`` package, which is not installed here (no GPU). Only for that import, the
    module is stood in by one naming Gym's HTTP ``VLLMModel`` classes; the mixin, the one
    piece used, is Gym's code unchanged."""
    import types

    from responses_api_models.vllm_model import app as vllm_app

    name = "responses_api_models.local_vllm_model.app"
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:
            stand_in = types.ModuleType(name)
            stand_in.LocalVLLMModel = vllm_app.VLLMModel  # type: ignore[attr-defined]
            stand_in.LocalVLLMModelConfig = vllm_app.VLLMModelConfig  # type: ignore[attr-defined]
            sys.modules[name] = stand_in
    from responses_api_models.genrm_model.app import GenRMModelMixin

    return GenRMModelMixin


def _model(args: argparse.Namespace) -> Any:
    from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

    GenRMModelMixin = _genrm_model_mixin()

    class Config(VLLMModelConfig):  # type: ignore[misc]
        supports_principle_role: bool = True

    class GenRMOnVLLM(GenRMModelMixin, VLLMModel):  # type: ignore[misc, valid-type]
        config: Config

    config = Config(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name=MODEL_SERVER,
        base_url=f"{args.judge_url}/v1",
        api_key="unused",
        model=args.model,
        return_token_id_information=False,
        uses_reasoning_parser=True,  # the fake judge answers with reasoning_content
    )
    return GenRMOnVLLM(config=config, server_client=_server_client(None))


def _genrm_compare(args: argparse.Namespace) -> Any:
    from resources_servers.genrm_compare.app import (
        GenRMCompareConfig,
        GenRMCompareResourcesServer,
    )

    config = GenRMCompareConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name="genrm_compare",
        genrm_model_server={"type": "responses_api_models", "name": MODEL_SERVER},
        genrm_responses_create_params={"input": [], "max_output_tokens": args.max_tokens},
        num_rollouts_per_prompt=args.size,
        comparison_strategy=args.strategy,
        use_principle=True,
        default_principle=args.principle,
    )
    return GenRMCompareResourcesServer(config=config, server_client=_server_client(args.model_port))


def _genrm_grpc_compare(args: argparse.Namespace) -> Any:
    from genrm_grpc_compare.app import GenRMGrpcCompareConfig, GenRMGrpcCompareResourcesServer

    config = GenRMGrpcCompareConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name="genrm_grpc_compare",
        grpc_target=args.grpc_target,
        num_rollouts_per_prompt=args.size,
    )
    return GenRMGrpcCompareResourcesServer(config=config, server_client=_server_client(None))


async def _serve(server: Any) -> None:
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    while not uv.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    print(f"serving on 127.0.0.1:{port}", flush=True)
    # Nobody reads stdout after the readiness line: Gym's own prints go to the log.
    os.dup2(2, 1)
    await task  # uvicorn handles SIGTERM: graceful exit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gym_servers")
    sub = parser.add_subparsers(dest="kind", required=True)
    model = sub.add_parser("model")
    model.add_argument("--judge-url", required=True)
    model.add_argument("--model", required=True)
    compare = sub.add_parser("genrm_compare")
    compare.add_argument("--model-port", type=int, required=True)
    compare.add_argument("--size", type=int, required=True)
    compare.add_argument("--strategy", default="circular")
    compare.add_argument("--principle", required=True)
    compare.add_argument("--max-tokens", type=int, default=1024)
    ours = sub.add_parser("genrm_grpc_compare")
    ours.add_argument("--grpc-target", required=True)
    ours.add_argument("--size", type=int, required=True)
    args = parser.parse_args(argv)
    # Gym reads its global config lazily with Hydra, from the command line: leave it none.
    sys.argv = sys.argv[:1]
    build = {
        "model": _model,
        "genrm_compare": _genrm_compare,
        "genrm_grpc_compare": _genrm_grpc_compare,
    }[args.kind]
    asyncio.run(_serve(build(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
