# Two commands set everything up from nothing: `make run` and `make test`.
# `make run` is a first run that learns in minutes: CartPole on a CPU, Pong where a GPU is
# (`edgerl train --quick`); `make run ARGS="--env ALE/Breakout-v5"` passes options on, and
# `make test ARGS=tests/test_seeds.py` passes pytest its own.
# It installs what running needs (edgerl, PyTorch, the plot extra: with PyTorch's CPU build about
# 250 MB to download, 1.1 GB in .venv); `make test` adds the test extras (ONNX Runtime, pygame,
# ffmpeg for MP4s, Ray for the fleet's tests, pytest, ruff, the web extra and Selenium: about 0.67 GB more).
PYTHON ?= python3
VENV ?= .venv
# PyTorch, pinned. Where pip finds it decides which build comes, and how much, so the build is
# chosen before the download (scripts/install_torch.sh):
# - a wheel pip finds offline is taken (on this project's CI machines the CPU wheel lies on local
#   disk, pip's find-links);
# - else, on a machine without an NVIDIA GPU, PyTorch's CPU index: the CPU build, a 190 MB wheel;
# - else PyPI: on Linux the CUDA build, a 530 MB wheel that pulls in several GB of NVIDIA
#   libraries (CUDA, cuDNN, NCCL, Triton); right for a desktop GPU.
# TORCH_INDEX=URL takes it from that index instead (https://download.pytorch.org/whl/cpu: the
# CPU build; https://pypi.org/simple: PyPI's). It applies when .venv is made: `make clean` first
# to change the build of an existing one.
TORCH ?= torch==2.13.0
TORCH_INDEX ?= auto
# The extras `make run` installs: plot (`edgerl plot`); EXTRAS=commands gives every command of the
# README what it needs at once (export, view, serve, play --record, plot, results: about 0.45 GB more).
EXTRAS ?= plot
comma := ,
BIN := $(VENV)/bin
TORCH_STAMP := $(VENV)/.installed-torch
RUN_STAMP := $(VENV)/.installed-run-$(subst $(comma),-,$(EXTRAS))
TEST_STAMP := $(VENV)/.installed-test
LINT_PATHS := edgerl tests $(wildcard scripts/*.py)

.PHONY: run test lint format bench clean

# No -q on the large installs: pip shows what it fetches and its progress.
$(TORCH_STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	bash scripts/install_torch.sh $(BIN) "$(TORCH)" "$(TORCH_INDEX)"
	touch $@

$(RUN_STAMP): $(TORCH_STAMP) pyproject.toml
	@echo "== installing edgerl with edgerl[$(EXTRAS)] (the plot extra alone: about 200 MB in .venv)"
	$(BIN)/pip install -e ".[$(EXTRAS)]"
	touch $@
	@echo "== edgerl is $(BIN)/edgerl; to type plain 'edgerl' as the docs do: . $(BIN)/activate"

$(TEST_STAMP): $(TORCH_STAMP) pyproject.toml
	@echo "== installing edgerl with the plot and test extras (about 0.9 GB in .venv)"
	$(BIN)/pip install -e ".[test,plot]"
	touch $@

run: $(RUN_STAMP)
	$(BIN)/edgerl train --quick $(ARGS)

test: $(TEST_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/pytest -q --durations=25 $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

format: $(TEST_STAMP)
	$(BIN)/ruff format $(LINT_PATHS)

bench: $(RUN_STAMP)
	$(BIN)/edgerl bench

clean:
	rm -rf $(VENV) build *.egg-info
