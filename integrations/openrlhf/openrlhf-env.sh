#!/usr/bin/env bash
# Build, once, the venv in which the OpenRLHF suite runs: Python 3.11 with every package
# of requirements-test.lock, openrlhf==0.11.2 among them, installed without resolving
# dependencies (its full install needs CUDA builds; the suite needs only its reward path).
# The venv is reused while the lock and the interpreter version are unchanged (key in
# VENV/.key); genrm-grpc itself is imported from the checkout, so code changes never
# need a rebuild.
#
#   integrations/openrlhf/openrlhf-env.sh [VENV]        (default build/openrlhf-venv)
#
# Built by integrations/cpu-torch-env.sh. The interpreter: $OPENRLHF_PYTHON if set, else python3.11, else python3. torch is the
# CPU build (torch==2.13.0+cpu): pip finds it where its configuration points (a local
# wheel directory) or on the CPU wheel index, which is added when it answers.
# Cold: 1.5 to 2 minutes, 1.2 GB; warm: a second.
set -euo pipefail
here=$(dirname "$0")
exec bash "$here/../cpu-torch-env.sh" openrlhf "${1:-build/openrlhf-venv}" \
    integrations/openrlhf/requirements-test.lock "${OPENRLHF_PYTHON:-}" \
    "import openrlhf.utils.agent, torch, transformers"
