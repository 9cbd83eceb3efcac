# Targets: `make env` (versions and which paths run here: python -m parity --env), `make parity`
# (python -m parity $(PARITY_ARGS)), `make test` (pytest $(PYTEST_ARGS)), `make bench`
# (python -m bench $(BENCH_ARGS), default --write-dispatch), `make clean`.
# The first use of any of them creates .venv and installs the project with [dev]. On a machine
# without an NVIDIA GPU, torch is pinned to the CPU build (constraints-cpu.txt); any looser spec
# would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
CONSTRAINTS := $(if $(HAS_GPU),,-c constraints-cpu.txt)
# Without a GPU the tests are CPU-bound interpreter runs: spread them over the cores (pytest-xdist;
# 2 on the CI machine: 18.5 -> 11 min, measured 2026-11-30). On a GPU machine they share one GPU,
# so they run in one process.
XDIST := $(if $(HAS_GPU),,-n auto --maxprocesses=4)
PYTEST_ARGS ?=
BENCH_ARGS ?= --write-dispatch

.PHONY: parity test bench env clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[dev]'
	touch $@

parity: $(VENV)/.installed
	$(PY) -m parity $(PARITY_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) -m bench $(BENCH_ARGS)

env: $(VENV)/.installed
	$(PY) -m parity --env

clean:
	rm -rf $(VENV) *.egg-info
