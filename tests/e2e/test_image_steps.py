"""The Dockerfile's build and install steps, run in a scratch venv (no Docker engine here)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import venv

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
_UNTRACKED = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".*cache")

pytestmark = pytest.mark.e2e


def test_image_steps_build_wheels_and_install_a_working_server_offline(
    tmp_path: pathlib.Path,
) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "sh docker/build-wheels.sh /src /wheels" in dockerfile
    assert "sh /tmp/install.sh /wheels" in dockerfile
    # The build stage sees only what its COPY lines bring into /src: build from that.
    src = tmp_path / "src"
    src.mkdir()
    build_stage = dockerfile.split(" AS runtime", 1)[0]
    for line in build_stage.splitlines():
        if line.startswith("COPY "):
            *sources, dest = line.split()[1:]
            for name in sources:
                target = src / dest / pathlib.Path(name).name if dest == "./" else src / dest
                if (ROOT / name).is_dir():
                    shutil.copytree(ROOT / name, target, ignore=_UNTRACKED)
                else:
                    shutil.copy(ROOT / name, target)
    wheels = tmp_path / "wheels"
    # The build stage runs with the image's Python; here, with this interpreter.
    subprocess.run(
        ["sh", str(src / "docker" / "build-wheels.sh"), str(src), str(wheels)],
        check=True,
        env={"PATH": f"{pathlib.Path(sys.executable).parent}:/usr/bin:/bin"},
        timeout=600,
    )
    runtime = tmp_path / "runtime"
    venv.create(runtime, with_pip=True)
    bin_dir = runtime / "bin"
    subprocess.run(
        ["sh", str(ROOT / "docker" / "install.sh"), str(wheels)],
        check=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        timeout=600,
    )
    installed = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {line.split("==")[0].lower() for line in installed.splitlines()}
    assert {"genrm-grpc", "genrm-cohort-client", "grpcio", "httpx"} <= names
    # Runtime only: no test, lint or code-generation tools in the image.
    assert not names & {"pytest", "mypy", "ruff", "grpcio-tools", "hypothesis", "buf-bin"}
    invalid = subprocess.run(
        [str(bin_dir / "genrm-grpc"), "serve", "--cohort-collection-timeout-s", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert invalid.returncode == 2 and "invalid configuration" in invalid.stderr


def test_the_image_takes_listen_from_its_config_and_ships_one_on_all_addresses() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = dockerfile.split("\nCMD ", 1)[1].splitlines()[0]
    assert json.loads(cmd) == ["--config", "/etc/genrm/server.yaml"]  # no --listen
    assert "COPY docker/server.yaml /etc/genrm/server.yaml" in dockerfile
    config = yaml.safe_load((ROOT / "docker" / "server.yaml").read_text())
    assert config == {"listen": "0.0.0.0:50051"}
    health = dockerfile.split("HEALTHCHECK", 1)[1].split("CMD ", 1)[1].splitlines()[0]
    assert json.loads(health) == ["genrm-grpc", "health", "--config", "/etc/genrm/server.yaml"]
