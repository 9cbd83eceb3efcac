# Targets: `make env` (versions and which paths run here: python -m parity --env), `make parity`
# (python -m parity $(PARITY_ARGS)), `make test` (pytest $(PYTEST_ARGS)), `make bench`
# (python -m bench $(BENCH_ARGS), default --write-dispatch), `make report` (one file to attach
# to a bug report or pull request: environment, parity --full --strict, bench --targets, the
# dispatch tables; REPORT=path names it), `make aot-record` (the sm_120 compile record the tests
# read), `make clean`.
# The first use of any of them creates .venv and installs the project with [dev]. On a machine
# without an NVIDIA GPU, torch is pinned to the CPU build (constraints-cpu.txt); any looser spec
# would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
CONSTRAINTS := $(if $(HAS_GPU),,-c constraints-cpu.txt)
# Without a GPU the tests are CPU-bound interpreter runs: spread them over the cores (pytest-xdist;
# 2 on the CI machine: 18.5 -> 11 min, measured 2026-11-30; tests/TEST_TIME.md has the later runs). On a GPU machine they share one GPU,
# so they run in one process. --dist worksteal: each worker starts with one contiguous half of
# the collection (tests/conftest.py puts the slow ones first) and an idle worker takes half of
# the other's remaining tests, so the workers finish together while neighbouring tests (a
# file's cases sharing one jitted program, the AOT checks sharing one launcher's compiles) stay
# in one process and reuse its caches instead of compiling the same program at the same time
# in both (was --maxschedchunk=2, tests dealt two at a time: tests/TEST_TIME.md, run CC).
XDIST := $(if $(HAS_GPU),,-n auto --maxprocesses=4 --dist worksteal)
PYTEST_ARGS ?=
BENCH_ARGS ?= --write-dispatch

REPORT ?= dsa-report-$(shell date -u +%Y%m%dT%H%M%SZ).txt

.PHONY: parity test bench env report clean aot-record

# Without a GPU, the Triton version of the GPU image (GPU_IMAGE_TRITON) is also unpacked into
# $(VENV)/triton-gpu-image (no dependencies, not importable by default): the sm_120 fit check
# (tests/test_triton_compile.py) compiles every launch config with it as well as with the
# installed Triton, so fit and registers come from the compiler the GPU runs too.
GPU_IMAGE_TRITON := 3.6.0

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[dev]'
	touch $@

GPU_IMAGE_TRITON_DIR := $(if $(HAS_GPU),,$(VENV)/triton-gpu-image/.installed)

$(VENV)/triton-gpu-image/.installed: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/triton-gpu-image 'triton==$(GPU_IMAGE_TRITON)'
	touch $@

parity: $(VENV)/.installed
	$(PY) -m parity $(PARITY_ARGS)

test: $(VENV)/.installed $(GPU_IMAGE_TRITON_DIR)
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# Compile every sm_120 launch spec with the GPU image's Triton and rewrite tests/aot_record/ (the
# results `make test` reads for specs whose Triton cache key is unchanged; tests/test_triton_compile.py).
# Run it after changing a kernel, a launch config or GPU_IMAGE_TRITON, and commit the record. The keys
# include the Triton build (the Python 3.11 wheel CI installs): on another Python every spec misses
# and is compiled, as before the record; on a GPU machine (Triton 3.6.0 installed) nothing is written.
aot-record: $(VENV)/.installed $(GPU_IMAGE_TRITON_DIR)
	DSA_AOT_RECORD=write $(PY) -m pytest -q $(XDIST) tests/test_triton_compile.py -k gpu_image_triton

bench: $(VENV)/.installed
	$(PY) -m bench $(BENCH_ARGS)

env: $(VENV)/.installed $(GPU_IMAGE_TRITON_DIR)
	$(PY) -m parity --env

# Every step runs even when an earlier one fails; its exit status is written into the file.
report: $(VENV)/.installed
	@{ echo "# dsa-kernels report, $$(date -u +%Y-%m-%dT%H:%M:%SZ), commit $$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"; \
	  echo; echo "## environment: python -m parity --env"; \
	  $(PY) -m parity --env 2>&1 || echo "[exit status $$?]"; \
	  echo; echo "## python -m parity --full --strict"; \
	  COLUMNS=160 $(PY) -m parity --full --strict --no-progress 2>&1 || echo "[exit status $$?]"; \
	  echo; echo "## python -m bench --targets"; \
	  $(PY) -m bench --targets --no-progress --no-plot 2>&1 || echo "[exit status $$?]"; \
	  echo; echo "## dispatch tables (kernels/dispatch/*.json)"; \
	  for f in kernels/dispatch/*.json; do echo "### $$f"; cat "$$f"; echo; done; \
	} > $(REPORT)
	@echo "wrote $(REPORT): attach it to the bug report or pull request"

clean:
	rm -rf $(VENV) *.egg-info
