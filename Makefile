# meshspec: `make conform` runs the main job (the conformance suite against the reference implementation on the
# embedded SQLite default), `make test` runs the tests. Both set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.meshspec-installed

.PHONY: setup conform test lint slow

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
	$(BIN)/python -m pytest -q -m "not slow"

slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow
