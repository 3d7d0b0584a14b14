# meshspec: `make conform` runs the main job (the conformance suite against the reference implementation on the
# embedded SQLite default), `make test` runs the tests. Both set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.meshspec-installed

# make test runs on this many pytest-xdist workers: most tests wait on sockets, timers and child processes, not CPU
TEST_WORKERS ?= 3

.PHONY: setup conform test lint slow slow-bounded bench interop interop-check

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

conform: $(STAMP)
	$(BIN)/meshconform run --target reference --report-dir reports/conformance
	$(BIN)/meshconform broker --report-dir reports/conformance-broker

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	$(BIN)/meshd spec check
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=15

# Soak and scale runs at full size (minutes per test) ...
slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# ... and the bounded form CI runs after `make test`: every slow test, at sizes that keep it bounded (the kill matrix,
# tests/conformance/test_mutants.py, runs whole: about 14 minutes on 2 cores, MESHSPEC_MUTANT_WORKERS runs at once).
slow-bounded: $(STAMP)
	MESHSPEC_SLOW_KILLS=150 MESHSPEC_SLOW_BUDGET=60 MESHSPEC_SLOW_EVENTS=2M MESHSPEC_SLOW_FUZZ_EXAMPLES=800 MESHSPEC_SLOW_HOOK_KILLS=25 \
	MESHSPEC_SLOW_SOAK_S=30 $(BIN)/python -m pytest -q -m slow

# The benchmarks (bench/README.md): the speed targets of the issues, printed as ratios. Minutes, not seconds.
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/send_throughput.py
	$(BIN)/python bench/broker_accept.py
	$(BIN)/python bench/trace_check.py
	$(BIN)/python bench/conformance_run.py
	$(BIN)/python bench/hostile_health.py

# The upstream claudemesh daemon builds (../shared/upstream/, absent from a user's clone: then this says so and
# exits 0): `interop` records fixtures/interop/<build>/ and its README; `interop-check` (CI) re-runs 1.21.1 and fails
# when a verdict moved from the recorded one.
UPSTREAM ?= ../shared/upstream
interop: $(STAMP)
	$(BIN)/python fixtures/interop/run.py --write --upstream $(UPSTREAM)

interop-check: $(STAMP)
	$(BIN)/python fixtures/interop/run.py --check --build 1.21.1 --upstream $(UPSTREAM)
