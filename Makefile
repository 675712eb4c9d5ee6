# Two commands set everything up from nothing: `make run` and `make test`.
# `make run` is a first run that learns in minutes: CartPole on a CPU, Pong where a GPU is
# (`edgerl train --quick`); `make run ARGS="--env ALE/Breakout-v5"` passes options on.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch; on CI machines this wheel is on local disk.
# Override for a GPU desktop, e.g. `make test TORCH=torch`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINT_PATHS := edgerl tests $(wildcard scripts/*.py)

.PHONY: run test lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,plot]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/edgerl train --quick $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

format: $(STAMP)
	$(BIN)/ruff format $(LINT_PATHS)

bench: $(STAMP)
	$(BIN)/edgerl bench

clean:
	rm -rf $(VENV) build *.egg-info
