# make demo: train the tiny policy on the default task (CPU, a few minutes).
# make test: the whole test suite.
# Both create .venv on first use: torch==2.13.0 first (a CPU build on CPU machines), then
# the package in editable mode with the extras it needs.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench-trl bench-memory clean-venv

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

# Benchmarks against TRL's GRPOTrainer run in their own venv (TRL pins its own versions).
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml Makefile
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(BENCH_VENV)/bin/python -m pip install --quiet -e . "trl==1.16.0" "datasets>=3"
	touch $@

bench-trl: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/trl_vs_ours.py --setting tiny

bench-memory: $(STAMP)
	$(PY) benchmarks/logprob_memory.py

clean-venv:
	rm -rf $(VENV) $(BENCH_VENV)
