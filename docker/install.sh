#!/bin/sh
# Runtime stage of the image: install only the runtime wheels, offline, from WHEEL_DIR.
# Usage: install.sh WHEEL_DIR
set -eu
python -m pip install --quiet --no-index --find-links "$1" genrm-grpc
