#!/usr/bin/env bash
# Build, once, the venv in which the NeMo Gym suite runs: Python >= 3.12 (nemo-gym's
# floor) with every package of requirements-test.lock. The venv is reused while the lock
# and the interpreter version are unchanged (key in VENV/.key); genrm-grpc itself is
# imported from the checkout, so code changes never need a rebuild.
#
#   integrations/nemo_gym/gym-env.sh [VENV]        (default build/gym-venv)
#
# The interpreter: $GYM_PYTHON if set, else the first Python >= 3.12 with venv among
# python3.12/3.13/3.14 on PATH, pyenv's installed versions and /usr/bin/python3*; where
# none exists and apt-get works (root on Debian/Ubuntu), Debian's python3 + python3-venv
# are installed and tried. Cold: 7 to 10 minutes (ray, mlflow, datasets are large);
# warm: a few seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-build/gym-venv}
LOCK=integrations/nemo_gym/requirements-test.lock

usable() {  # usable PYTHON -> prints its version when it is >= 3.12 and has venv + ensurepip
    "$1" -c 'import sys, venv, ensurepip
assert sys.version_info >= (3, 12)
print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}

candidates() {
    if [ -n "${GYM_PYTHON:-}" ]; then echo "$GYM_PYTHON"; return; fi
    for name in python3.12 python3.13 python3.14; do command -v "$name" || true; done
    if command -v pyenv >/dev/null 2>&1; then
        ls -d "$(pyenv root)"/versions/3.1[2-9]*/bin/python3 2>/dev/null || true
    fi
    ls /usr/bin/python3.1[2-9] /usr/local/bin/python3.1[2-9] 2>/dev/null || true
    echo /usr/bin/python3
}

find_python() {
    local c v
    while read -r c; do
        [ -n "$c" ] || continue
        if v=$(usable "$c"); then echo "$c $v"; return 0; fi
    done < <(candidates)
    return 1
}

if ! found=$(find_python); then
    if [ -z "${GYM_PYTHON:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "gym-env: no Python >= 3.12 with venv; installing Debian's python3 and python3-venv" >&2
        apt-get update -qq >/dev/null && apt-get install -y -qq python3 python3-venv >/dev/null || true
        found=$(find_python) || true
    fi
fi
if [ -z "${found:-}" ]; then
    echo "gym-env: nemo-gym needs Python >= 3.12 with venv and none was found (set GYM_PYTHON=/path/to/python3.12)" >&2
    exit 1
fi
python=${found% *}
version=${found#* }
key="$version $(sha256sum "$LOCK" | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.key" 2>/dev/null)" = "$key" ]; then
    exit 0
fi
echo "gym-env: building $VENV with Python $version ($python); cold this takes minutes" >&2
rm -rf "$VENV"
"$python" -m venv "$VENV"
# (pip's notes about unreadable local index paths of some machines are filtered out)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$LOCK" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
echo "$key" > "$VENV/.key"
