# The two commands of the README. Both create .venv (CPU build of torch when there is no GPU).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TEST_WORKERS ?= 2

.PHONY: setup demo test test-slow lint gpu-session

$(BIN)/kernelsmith: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# With an NVIDIA driver, PyPI's CUDA torch; without one, the CPU build (an unpinned torch
	# would pull a multi-GB CUDA build onto a machine that cannot use it). A torch already in
	# the venv is kept.
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	  else $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e ".[dev]"
	touch $(BIN)/kernelsmith

setup: $(BIN)/kernelsmith

# The main job: tune RMSNorm for a Llama-sized activation (on a machine without a GPU it runs in
# the Triton interpreter on a small shape, and says so), then show the stored decision.
demo: setup
	$(BIN)/kernelsmith tune rmsnorm --shape 8192x4096 --dtype bf16 --budget 50
	$(BIN)/kernelsmith tune rmsnorm --shape 8192x4096 --dtype bf16 --budget 50 --json

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	# Two test processes (pytest-xdist, idle ones stealing queued tests):
	# the suite is CPU-bound in the Triton interpreter, and CI has two cores. TEST_WORKERS=0 runs serially.
	$(BIN)/python -m pytest -q -m "not gpu and not slow" -n $(TEST_WORKERS) --dist worksteal

# The tests marked slow (each tens of seconds to minutes in the interpreter): CI runs them after `make test`.
test-slow: setup
	$(BIN)/python -m pytest -q -m "slow and not gpu" -n $(TEST_WORKERS) --dist worksteal

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
