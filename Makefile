# The two commands of the README. Each creates .venv when missing and installs the project.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint typecheck unit bench api-docs renderers

demo: $(VENV)/.installed-local
	$(BIN)/tessera demo

test: $(VENV)/.installed-dev renderers lint typecheck unit

lint: $(VENV)/.installed-dev
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# The suite runs in TEST_WORKERS processes (pytest-xdist), each with its own NATS and PostgreSQL
# (the session fixtures of tests/conftest.py): on CI's 2 cores 2 workers take about two thirds of
# the time of one, because most tests wait on servers and subprocesses. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
unit: $(VENV)/.installed-dev
	$(BIN)/pytest -n $(TEST_WORKERS)

# The renderers the tests run for real (Debian packages; the machines run as root). Installs only
# when one is missing from PATH; refreshes the package lists only if the first try fails.
RENDERER_BINS := blender povray chromium
renderers:
	@missing=""; for b in $(RENDERER_BINS); do command -v $$b >/dev/null || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing the renderers (missing:$$missing)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq $(RENDERER_BINS) >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq $(RENDERER_BINS) >/dev/null; }; \
	fi

# docs/api.md is generated from proto/ (a test fails when it is stale)
api-docs: $(VENV)/.installed-dev
	$(BIN)/python -m proto.apidoc > docs/api.md

bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench.kernel
	$(BIN)/python -m bench.png
	$(BIN)/python -m bench.pipeline
	$(BIN)/python -m bench.sweeper

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-local: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[local]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.installed-local
