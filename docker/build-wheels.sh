#!/bin/sh
# Build stage of the image (also run by tests/e2e/test_image_steps.py in a scratch venv):
# wheels for the server, the client distribution and every runtime dependency, pinned by
# constraints.txt. Usage: build-wheels.sh SOURCE_DIR WHEEL_DIR
set -eu
src=$1
out=$2
python -m pip wheel --quiet --wheel-dir "$out" -c "$src/constraints.txt" \
    "$src/clients/python" "$src"
