"""Our engine behind verifiers' token-in endpoint, called by the real verifiers 0.4 client (its
``renderers.client.generate``, run from its own venv: VERIFIERS_PYTHON, default
.venv-verifiers/bin/python, made by make test): the ids and log-probs it parses are exactly what the engine sampled."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from grpo_lightning.environments.adapters.verifiers import GenerateServer
from grpo_lightning.rollout.engine import Sampling
from tests.helpers.episodes import FakeEngine, chatml_tokenizer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# verifiers lives in a venv of its own (its pins are not ours), made by `make test` (Makefile).
PYTHON = os.environ.get("VERIFIERS_PYTHON", str(ROOT / ".venv-verifiers" / "bin" / "python"))
CLIENT = Path(__file__).resolve().parents[1] / "helpers" / "verifiers_generate_client.py"


def test_the_real_verifiers_client_gets_exactly_the_sampled_ids_and_logprobs(tmp_path):
    if not Path(PYTHON).exists():
        pytest.fail(f"no verifiers venv at {PYTHON}: run `make .venv-verifiers/.installed` (or set VERIFIERS_PYTHON)")
    tokenizer = chatml_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    engine = FakeEngine(len(tokenizer), tokenizer.eos_token_id, eos_rate=0.2)
    with GenerateServer(engine, Sampling(8, 1.0, 1.0, 0), seed=7) as server:
        run = subprocess.run(
            [PYTHON, str(CLIENT), server.url, str(tmp_path / "tokenizer")], capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr[-3000:]
        turns = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(turns) == len(server.requests) == len(engine.outputs) == 2
    first = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi there"}], add_generation_prompt=True, tokenize=False
    )
    assert turns[0]["prompt_ids"] == tokenizer(first, add_special_tokens=False)["input_ids"]
    for turn, request, completion in zip(turns, server.requests, engine.outputs.values(), strict=True):
        assert turn["prompt_ids"] == request["token_ids"]  # the client's own render, served as given
        assert tokenizer.eos_token_id in request["sampling_params"]["stop_token_ids"]
        assert turn["completion_ids"] == completion.token_ids
        assert turn["completion_logprobs"] == pytest.approx(completion.logprobs)
        assert (turn["finish_reason"] == "stop") == completion.finished
