# make demo: train the tiny policy on the default task (CPU, a few minutes).
# make test: the whole test suite.
# Both create .venv on first use: torch==2.13.0 first (a CPU build on CPU machines), then
# the package in editable mode with the extras it needs.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m grpo_lightning.train

test: $(STAMP)
	$(PY) -m pytest tests -q

clean-venv:
	rm -rf $(VENV)
