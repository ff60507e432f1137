#!/usr/bin/env bash
# Build, once, the venv in which the verl suite runs: Python 3.11 with every package of
# requirements-test.lock, verl==0.9.1 among them, installed without resolving
# dependencies (verl's full install pulls a CUDA torch and training-only packages; the
# suite needs only its reward loop). The venv is reused while the lock and the interpreter
# version are unchanged (key in VENV/.key); genrm-grpc itself is imported from the
# checkout, so code changes never need a rebuild.
#
#   integrations/verl/verl-env.sh [VENV]        (default build/verl-venv)
#
# Built by integrations/cpu-torch-env.sh. The interpreter: $VERL_PYTHON if set, else python3.11, else python3 (verl 0.9.1 supports
# Python >= 3.10). torch is the CPU build (torch==2.13.0+cpu): pip finds it where its
# configuration points (a local wheel directory) or on the CPU wheel index, which is added
# when it answers. Cold: 1 to 3 minutes, 1.5 GB; warm: a second.
set -euo pipefail
here=$(dirname "$0")
exec bash "$here/../cpu-torch-env.sh" verl "${1:-build/verl-venv}" \
    integrations/verl/requirements-test.lock "${VERL_PYTHON:-}" \
    "import verl.experimental.reward_loop.reward_loop, torch, transformers, tokenizers"
