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

$(STAMP): setup.cfg setup.py pyproject.toml scripts/install-system-packages.sh
	bash scripts/install-system-packages.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,test]'
	# Stack notes: PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU torch
	# and break transformers' LlamaConfig import; text models need none of them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# The whole suite in three pytest sessions at once, after ruff. The critical path is the heavy
# integration part (Ray clusters and vLLM engines, in one process: they share test beds, Ray
# clusters and served models through session fixtures); it starts first, at normal priority.
# Beside it run the light integration part (test beds only: SSH, model sync, preflight, the
# collective check; no Ray, no vLLM: it mostly waits on networks and timeouts) and, at the lowest
# CPU priority (nice 19), mypy and then the fast tests on two pytest-xdist workers: an engine start
# leaves part of the 2 cores idle (docs/testing.md), and those jobs take only what the heavy part
# leaves, so they do not lengthen it. Their reports are printed when the heavy part is done
# (tests/integration/conftest.py: the parts; docs/testing.md: measured). pytest's exit 5 ("no
# tests collected") is a failure when no run collected a test (PYTEST_ARGS may select only one
# part). --durations: CI's log ends with the slowest tests.
FAST_TESTS := tests/unit tests/workflows tests/cli
INTEGRATION_TESTS := tests/integration
TEST_WORKERS ?= 2
# Lint: ruff (pyflakes, pycodestyle, isort, bugbear, pyupgrade) and mypy, configured in
# pyproject.toml; the import-cycle test runs with the unit tests. `make test` runs ruff first and
# mypy beside the integration tests (above).
lint: install
	$(BIN)/ruff check orchestrator tests benchmarks scripts conftest.py
	$(BIN)/mypy

test: install
	$(BIN)/ruff check orchestrator tests benchmarks scripts conftest.py
	@set +e; \
	light_log=$$(mktemp /tmp/orch-light-tests.XXXXXX); fast_log=$$(mktemp /tmp/orch-fast-tests.XXXXXX); \
	$(BIN)/python -m pytest -p no:cacheprovider --durations=20 $(PYTEST_ARGS) --integration-part light $(INTEGRATION_TESTS) >$$light_log 2>&1 & light_pid=$$!; \
	( nice -n 19 $(BIN)/mypy; echo "mypy_rc=$$?"; \
	  nice -n 19 $(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --durations=10 $(PYTEST_ARGS) $(FAST_TESTS); echo "fast_rc=$$?" ) >$$fast_log 2>&1 & fast_pid=$$!; \
	trap 'pkill -TERM -P $$fast_pid 2>/dev/null; kill -TERM $$light_pid $$fast_pid 2>/dev/null' INT TERM HUP; \
	$(BIN)/python -m pytest --durations=60 $(PYTEST_ARGS) --integration-part heavy $(INTEGRATION_TESTS); slow=$$?; \
	wait $$light_pid; light=$$?; wait $$fast_pid; \
	echo "=== mypy and the fast tests (run beside the heavy integration tests above, at nice 19) ==="; cat $$fast_log; \
	mypy=$$(sed -n 's/^mypy_rc=//p' $$fast_log); fast=$$(sed -n 's/^fast_rc=//p' $$fast_log); rm -f $$fast_log; \
	echo "=== the light integration tests (run beside the heavy ones above) ==="; cat $$light_log; rm -f $$light_log; \
	if [ "$${mypy:-1}" -ne 0 ]; then echo "error: mypy failed (above)"; exit 1; fi; \
	if [ "$${fast:-1}" -eq 5 ] && [ $$slow -eq 5 ] && [ $$light -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; \
	for rc in $${fast:-1} $$slow $$light; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done; exit 0

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
