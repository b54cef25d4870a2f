"""Our engine behind verifiers' token-in endpoint, called by the real verifiers 0.4 client (its
``renderers.client.generate``, run from its own venv: VERIFIERS_PYTHON, default
.venv-verifiers/bin/python, made by make test): the ids and log-probs it parses are exactly what the engine sampled."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.environments.adapters.verifiers import GenerateServer
from grpo_lightning.environments.adapters.verifiers_rollout import VerifiersRollout
from grpo_lightning.rollout.engine import Sampling
from grpo_lightning.tasks.key_lookup import KeyLookupTaskConfig
from tests.helpers.episodes import FakeEngine, chatml_tokenizer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# verifiers lives in a venv of its own (its pins are not ours), made by `make test` (Makefile).
PYTHON = os.environ.get("VERIFIERS_PYTHON", str(ROOT / ".venv-verifiers" / "bin" / "python"))
CLIENT = Path(__file__).resolve().parents[1] / "helpers" / "verifiers_generate_client.py"
# The tiny model's alphabet has no letters: each message's content, then = (or EOS after the model's turn).
TINY_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}={% endif %}"
    "{% endfor %}"
)


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


def test_five_training_steps_on_a_real_verifiers_environment(tmp_path):
    """The tiny model plays a real verifiers SingleAgentEnv (null chat harness, subprocess runtime, the
    train client) through the driver; each step's batch is its traces' ids, sampled mask and log-probs."""
    if not Path(PYTHON).exists():
        pytest.fail(f"no verifiers venv at {PYTHON}: run `make .venv-verifiers/.installed` (or set VERIFIERS_PYTHON)")
    cfg = TrainConfig(task=KeyLookupTaskConfig(key_style="digits", question="{key}?", num_keys=20))
    cfg.trainer.max_steps, cfg.trainer.output_dir, cfg.logger.kind = 5, str(tmp_path), "none"
    cfg.rollout.max_new_tokens, cfg.rollout.prompts_per_step, cfg.rollout.num_generations = 6, 1, 2
    run = build_run(cfg)
    tokenizer = run.rollout.tokenizer
    tokenizer.chat_template = TINY_TEMPLATE  # verifiers' client renders with the saved tokenizer's template
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    rollout = VerifiersRollout(
        PYTHON,
        "verifiers_echo_taskset",
        str(tmp_path / "tokenizer"),
        task_index=lambda record: int(record["key"]) - 100,
        max_tokens=6,
        paths=(str(CLIENT.parent),),
    )
    run.rollout.episodes = rollout
    batches = []
    original = rollout.rollout
    rollout.rollout = lambda *args: batches.append(original(*args)) or batches[-1]
    try:
        trainer = run.trainer(cfg)
        trainer.fit(run.module, datamodule=run.datamodule)
    finally:
        rollout.close()
    assert trainer.global_step == 5 and len(batches) == 5
    for batch in batches:
        assert batch.num_sequences == 2 and batch.loss_mask.sum() > 0
    records = rollout.last_records
    assert all(r["ok"] for r in records), [r["errors"] for r in records]
    rewards = [sum(v["score"] * v["weight"] for v in r["rewards"].values()) for r in records]
    assert batches[-1].rewards.tolist() == pytest.approx(rewards)
    sampled = [[i for n in r["nodes"] for i, m in zip(n["token_ids"], n["mask"], strict=True) if m] for r in records]
    for row, ids in enumerate(sampled):
        mask = batches[-1].loss_mask[row].bool()
        assert batches[-1].completion_ids[row][mask].tolist() == ids
