"""A real run through the CLI: your jsonl and reward file, checkpoints, SIGKILL, exact resume, hf/final.

One uninterrupted 20-step run and one killed (SIGKILL) right after its step-10 checkpoint
then resumed with trainer.resume=auto must end with identical weights in hf/final, which
transformers loads and generates from. The finished run asked for 4 more steps trains them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

REWARDS = '''
from grpo_lightning.rewards import register_reward


@register_reward("e2e_exact")
def e2e_exact(prompts, completions, answer, completion_ids, trainer_state):  # TRL-style signature
    assert len(completion_ids) == len(completions) and trainer_state.global_step >= 0
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


@register_reward("e2e_length")
async def e2e_length(prompts, completions, difficulty, **kwargs):  # async, an extra column, some None
    return [None if d == "skip" else len(c) / 4 for c, d in zip(completions, difficulty)]
'''


def write_inputs(folder: Path) -> list[str]:
    sums = [(1, 2), (3, 4), (5, 1), (2, 2)]
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "difficulty": "skip" if a == 5 else "easy"} for a, b in sums]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "my_rewards.py").write_text(REWARDS)
    return [
        "task=dataset", "task.path=prompts.jsonl", "task.reward_modules=[my_rewards.py]",
        "+task.rewards={e2e_exact: 1.0, e2e_length: 0.5}", "rollout.prompts_per_step=4",
        "rollout.num_generations=4", "rollout.max_new_tokens=4", "algorithm.micro_batch_size=16",
        "trainer.max_steps=20", "trainer.checkpoint_every_n_steps=5", "logger=none",
    ]


def command(folder: Path, run: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "grpo_lightning.train", *args, f"hydra.run.dir={folder / run}"]


def run_cli(folder: Path, run: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(command(folder, run, *args), cwd=folder, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "hf" / "final" / "model.safetensors")


def test_killed_and_resumed_run_ends_where_the_uninterrupted_one_does(tmp_path):
    args = write_inputs(tmp_path)
    run_cli(tmp_path, "straight", *args)

    killed = subprocess.Popen(command(tmp_path, "killed", *args), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "killed" / "checkpoints" / "step_00000010.ckpt"
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (tmp_path / "killed" / "hf" / "final").exists()
    assert max(int(p.stem.split("_")[1]) for p in checkpoint.parent.glob("step_*.ckpt")) < 20

    resumed = run_cli(tmp_path, "killed", *args, "trainer.resume=auto")
    assert "resuming from" in resumed.stderr and "step_000000" in resumed.stderr
    straight, again = weights(tmp_path / "straight"), weights(tmp_path / "killed")
    assert straight.keys() == again.keys()
    assert max(float((straight[k] - again[k]).abs().max()) for k in straight) == 0.0
    # the last trainer.keep_checkpoints (2) are kept
    assert sorted(p.name for p in checkpoint.parent.glob("step_*.ckpt")) == ["step_00000015.ckpt", "step_00000020.ckpt"]

    # hf/final is a Hugging Face folder that transformers loads and generates from
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = tmp_path / "straight" / "hf" / "final"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {p.name for p in final.iterdir()}
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    ids = torch.tensor([tokenizer("3+4=")["input_ids"]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids.shape[1]
    assert tokenizer.decode(ids[0]) == "3+4="

    # a finished run asked for more steps trains them
    run_cli(tmp_path, "straight", *args, "trainer.resume=auto", "trainer.max_steps=24")
    assert (tmp_path / "straight" / "checkpoints" / "step_00000024.ckpt").exists()
    more = weights(tmp_path / "straight")
    assert max(float((more[k] - straight[k]).abs().max()) for k in more) > 0
