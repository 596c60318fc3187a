# The two commands of this project. Each does all of its own set-up.
#   make run   - create the venv if needed, install, fetch the embedded model once, train
#   make test  - create the venv if needed and run the test suite (CI runs this)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.installed
# The CPU build of torch lies on this machine's disk; installing it first stops pip from pulling
# a multi-GB CUDA build to satisfy the project's torch range.
TORCH  ?= torch==2.13.0

.PHONY: run test lint venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install "$(TORCH)" 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import marl, torch, transformers, pettingzoo" && touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/marl fetch-model
	$(VENV)/bin/marl train model=smollm2 hydra.run.dir=runs/default

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs outputs
