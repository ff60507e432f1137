"""The README's install commands work in a fresh venv, without make."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import venv
from importlib.metadata import version

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _documented_install() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## Installing", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    line = next(line for line in block.splitlines() if line.startswith("pip install "))
    return shlex.split(line.split("#", 1)[0])


def test_the_documented_pip_install_gives_a_working_server_and_client(
    tmp_path: pathlib.Path,
) -> None:
    command = _documented_install()
    assert command == ["pip", "install", "./clients/python", "."]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    subprocess.run(
        [str(bin_dir / "python"), "-m", *command, "--quiet"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=900,
    )
    shown = subprocess.run(
        [str(bin_dir / "genrm-grpc"), "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert shown.stdout == (
        f"genrm-grpc {version('genrm-grpc')} "
        f"(genrm-cohort-client {version('genrm-cohort-client')})\n"
    )
    imported = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import genrm_cohort_client, genrm_grpc; "
            "from genrm.cohort.v1 import cohort_pb2; "
            "print(genrm_cohort_client.__file__); print(genrm_grpc.__file__)",
        ],
        cwd=tmp_path,  # not the checkout: the installed copies must be the ones imported
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert all(str(env_dir) in path for path in imported.stdout.splitlines())
    licences = list((env_dir / "lib").glob("python3*/site-packages/genrm_*.dist-info/licenses"))
    assert len(licences) == 2 and all((d / "LICENSE").is_file() for d in licences)
