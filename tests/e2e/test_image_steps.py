"""The Dockerfile's build and install steps, run in a scratch venv (no Docker engine here)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_image_steps_build_wheels_and_install_a_working_server_offline(
    tmp_path: pathlib.Path,
) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "sh docker/build-wheels.sh /src /wheels" in dockerfile
    assert "sh /tmp/install.sh /wheels" in dockerfile
    wheels = tmp_path / "wheels"
    # The build stage runs with the image's Python; here, with this interpreter.
    subprocess.run(
        ["sh", str(ROOT / "docker" / "build-wheels.sh"), str(ROOT), str(wheels)],
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
