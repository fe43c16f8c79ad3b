# Two entry points, each doing its own set-up on a fresh machine:
#   make demo   - the training demo (examples/train_lm.py; installs the demo extra: matplotlib)
#   make test   - the test suite (CPU tests always; GPU tests when a GPU is present), as two pytest
#                 processes side by side (tests/run_in_shards.py); ARGS pass through to pytest
#   make lint   - ruff (config in pyproject.toml)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# On a machine with an NVIDIA driver, install the CUDA build of jax.
REQS := $(if $(shell command -v nvidia-smi 2>/dev/null),requirements-gpu.txt,requirements-cpu.txt)

.PHONY: demo test lint
$(VENV)/.installed-$(REQS): pyproject.toml $(REQS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r $(REQS)
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# The demo's extra (matplotlib for its figure) on top of the test environment.
$(VENV)/.installed-demo: $(VENV)/.installed-$(REQS)
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

demo: $(VENV)/.installed-demo
	$(PY) examples/train_lm.py $(ARGS)

test: $(VENV)/.installed-$(REQS)
	$(PY) tests/run_in_shards.py --durations=15 $(ARGS)

lint: $(VENV)/.installed-$(REQS)
	$(PY) -m ruff check .
