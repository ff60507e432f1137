#!/usr/bin/env bash
# The one builder of the framework suites' venvs (integrations/verl/verl-env.sh and
# integrations/openrlhf/openrlhf-env.sh call it): a venv with every package of a lock
# file, installed without resolving dependencies (the frameworks' full installs pull
# CUDA builds and training-only packages; the suites need only their reward paths),
# torch as its CPU build from where pip's configuration points (a local wheel directory)
# or from the CPU wheel index, which is added when it answers. The venv is reused while
# the lock and the interpreter version are unchanged (key in VENV/.key); genrm-grpc is
# imported from the checkout, so code changes never need a rebuild.
#
#   integrations/cpu-torch-env.sh NAME VENV LOCK PYTHON CHECK
#
# NAME labels the messages; PYTHON is the interpreter (empty: python3.11, else python3);
# CHECK is the Python statement that must run in the finished venv (its imports).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1 VENV=$2 LOCK=$3 CHECK=$5
TORCH_INDEX=https://download.pytorch.org/whl/cpu

python=${4:-$(command -v python3.11 || command -v python3)}
version=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
key="$version $(sha256sum "$LOCK" | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.key" 2>/dev/null)" = "$key" ]; then
    exit 0
fi
echo "$NAME-env: building $VENV with Python $version ($python); cold this takes minutes" >&2
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
"$VENV/bin/python" -c "$CHECK"
echo "$key" > "$VENV/.key"
