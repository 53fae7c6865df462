# The two commands: `make up` runs the whole system locally, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: up test test-unit test-e2e install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Run the local deployment in the foreground (Ctrl-C stops everything it started).
up: $(STAMP)
	$(PY) -m infra.local

## The whole test suite, end-to-end tests included (what CI runs).
test: $(STAMP)
	$(PY) -m pytest

test-unit: $(STAMP)
	$(PY) -m pytest -m "not e2e"

test-e2e: $(STAMP)
	$(PY) -m pytest -m e2e

clean:
	rm -rf $(VENV) .pytest_cache .local-state
