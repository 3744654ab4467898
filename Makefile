VENV ?= .venv
PY = $(VENV)/bin/python
# The CPU build on local disk; a bare `pip install torch` could resolve a multi-GB CUDA build.
TORCH ?= torch==2.13.0
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="tests/web -k login"`.
PYTEST_ARGS ?=
STAMP = $(VENV)/.autoweb-installed

.PHONY: install test run lint fmt

install:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

# `make test` and `make run` work on a fresh machine: they install first when needed.
$(STAMP): pyproject.toml
	$(MAKE) install

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

run: $(STAMP)
	$(PY) manage.py up

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .
