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
# The interpreter: $VERL_PYTHON if set, else python3.11, else python3 (verl 0.9.1 supports
# Python >= 3.10). torch is the CPU build (torch==2.13.0+cpu): pip finds it where its
# configuration points (a local wheel directory) or on the CPU wheel index, which is added
# when it answers. Cold: 1 to 3 minutes, 1.5 GB; warm: a second.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-build/verl-venv}
LOCK=integrations/verl/requirements-test.lock
TORCH_INDEX=https://download.pytorch.org/whl/cpu

python=${VERL_PYTHON:-$(command -v python3.11 || command -v python3)}
version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
key="$version $(sha256sum "$LOCK" | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.key" 2>/dev/null)" = "$key" ]; then
    exit 0
fi
echo "verl-env: building $VENV with Python $version ($python); cold this takes minutes" >&2
rm -rf "$VENV"
"$python" -m venv "$VENV"
index=()
if "$VENV/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" \
    "$TORCH_INDEX" >/dev/null 2>&1; then
    index=(--extra-index-url "$TORCH_INDEX")
fi
# (pip's notes about unreadable local index paths of some machines are filtered out)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${index[@]}" \
    -r "$LOCK" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
"$VENV/bin/python" -c "import verl.experimental.reward_loop.reward_loop, torch, transformers, tokenizers"
echo "$key" > "$VENV/.key"
