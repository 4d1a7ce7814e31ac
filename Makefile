# orch: the two first commands are `make demo` and `make test` (see README.md).
# Everything they need is installed here: Debian packages (sshd, iproute2, nftables) and .venv.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-unit demo demo-down demo-cluster clean lint bench mutation

install: $(STAMP)

# pip byte-compiles every file it installs on one core (85 s of a 137 s install here); compileall
# does the same on every core (46 s): the same .pyc files, the same invalidation mode. Its exit
# status is 1 for files Python 3.11 cannot parse (torch's py312 test helpers), which pip skips
# the same way. Stack notes: PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU
# torch and break transformers' LlamaConfig import; text models need none of them.
$(STAMP): setup.cfg setup.py pyproject.toml scripts/install-system-packages.sh
	bash scripts/install-system-packages.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e '.[cpu,test]'
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	touch $(STAMP)

# The whole suite, after ruff: the fast tests first, on two pytest-xdist workers (they share
# nothing; ~1.7x faster on 2 cores), then the integration tests in two pytest sessions at once:
# the light part (test beds only: SSH, model sync, preflight, the collective check; no Ray, no
# vLLM) beside the heavy part (Ray clusters and vLLM engines, in one process: they share test
# beds, Ray clusters and served models through session fixtures). The light part mostly waits on
# networks and timeouts, so it takes the second core while an engine starts on the first; mypy
# (one process, no timing in it) runs beside them too. Their reports are printed when the heavy
# part is done (tests/integration/conftest.py: the parts; docs/testing.md: measured, and why the
# fast tests are not run beside the heavy part). pytest's exit 5 ("no tests collected") is a
# failure when no run collected a test (PYTEST_ARGS may select only one part). --durations: CI's
# log ends with the slowest tests.
FAST_TESTS := tests/unit tests/workflows tests/cli
INTEGRATION_TESTS := tests/integration
TEST_WORKERS ?= 2
# Lint: ruff (pyflakes, pycodestyle, isort, bugbear, pyupgrade) and mypy, configured in
# pyproject.toml; the import-cycle test runs with the unit tests. `make test` runs ruff first and
# mypy beside the integration tests (above).
RUFF = $(BIN)/ruff check orchestrator tests benchmarks scripts conftest.py
lint: install
	$(RUFF)
	$(BIN)/mypy

test: install
	$(RUFF)
	@set +e; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=10 $(PYTEST_ARGS) $(FAST_TESTS); fast=$$?; \
	light_log=$$(mktemp /tmp/orch-light-tests.XXXXXX); mypy_log=$$(mktemp /tmp/orch-mypy.XXXXXX); \
	$(BIN)/python -m pytest -p no:cacheprovider --durations=20 $(PYTEST_ARGS) --integration-part light $(INTEGRATION_TESTS) >$$light_log 2>&1 & light_pid=$$!; \
	$(BIN)/mypy >$$mypy_log 2>&1 & mypy_pid=$$!; \
	trap 'kill -TERM $$light_pid $$mypy_pid 2>/dev/null' INT TERM HUP; \
	$(BIN)/python -m pytest --durations=60 $(PYTEST_ARGS) --integration-part heavy $(INTEGRATION_TESTS); slow=$$?; \
	wait $$light_pid; light=$$?; wait $$mypy_pid; mypy=$$?; \
	echo "=== mypy (run beside the integration tests above) ==="; cat $$mypy_log; rm -f $$mypy_log; \
	echo "=== the light integration tests (run beside the heavy ones above) ==="; cat $$light_log; rm -f $$light_log; \
	if [ $$mypy -ne 0 ]; then echo "error: mypy failed (above)"; exit 1; fi; \
	if [ $$fast -eq 5 ] && [ $$slow -eq 5 ] && [ $$light -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; \
	for rc in $$fast $$slow $$light; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done; exit 0

test-unit: install
	$(BIN)/python -m pytest -q tests/unit tests/cli

demo: install
	bash scripts/demo.sh

# The GPU serving path on two test hosts of this machine (root needed): one TP=2 replica spanning
# both through vLLM's Ray executor (test-bed stand-in for the GPUs); see docs/rollout.md.
demo-cluster: install
	bash scripts/demo_cluster.sh

demo-down: install
	$(BIN)/orch down cluster-templates/local.yaml

bench: install
	$(BIN)/python benchmarks/loadgen_capacity.py

# Mutation testing of the pure core (docs/testing.md): one module after another, 2 workers,
# niced; prints one JSON line per module and an overall line. Tens of minutes: not part of `test`.
MUTATION_ARGS ?=
mutation: install
	nice -n 19 $(BIN)/python scripts/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache mutants
