"""A real run through the CLI: your jsonl and reward file, checkpoints, SIGKILL, exact resume, hf/final.

One uninterrupted 20-step run and one killed (SIGKILL) right after its step-10 checkpoint
then resumed with trainer.resume=auto must end with identical weights in hf/final, which
transformers loads and generates from. A run stopped with Ctrl-C (SIGINT) exits 130 with a
checkpoint and the model and resumes to the same weights too. (A finished run asked for more
steps: tests/integration/test_resume.py.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.slow

REWARDS = """
from grpo_lightning.rewards import register_reward


@register_reward("e2e_exact")
def e2e_exact(prompts, completions, answer, completion_ids, trainer_state):  # TRL-style signature
    assert len(completion_ids) == len(completions) and trainer_state.global_step >= 0
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


@register_reward("e2e_length")
async def e2e_length(prompts, completions, difficulty, **kwargs):  # async, an extra column, some None
    return [None if d == "skip" else len(c) / 4 for c, d in zip(completions, difficulty)]
"""


def write_inputs(folder: Path) -> list[str]:
    sums = [(1, 2), (3, 4), (5, 1), (2, 2)]
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "difficulty": "skip" if a == 5 else "easy"} for a, b in sums]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "my_rewards.py").write_text(REWARDS)
    return [
        "task=dataset",
        "task.path=prompts.jsonl",
        "task.reward_modules=[my_rewards.py]",
        "+task.rewards={e2e_exact: 1.0, e2e_length: 0.5}",
        "rollout.prompts_per_step=4",
        "rollout.num_generations=4",
        "rollout.max_new_tokens=4",
        "algorithm.micro_batch_size=16",
        "trainer.max_steps=20",
        "trainer.checkpoint_every_n_steps=5",
        "logger=none",
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

    killed = subprocess.Popen(
        command(tmp_path, "killed", *args), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
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

    final = tmp_path / "straight" / "hf" / "final"
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in final.iterdir()
    }
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    ids = torch.tensor([tokenizer("3+4=")["input_ids"]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids.shape[1]
    assert tokenizer.decode(ids[0]) == "3+4="

    # Ctrl-C: the run stops after its step with a checkpoint and the model, exits 130, and resumes exactly
    interrupted = subprocess.Popen(
        command(tmp_path, "ctrl_c", *args), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    first = tmp_path / "ctrl_c" / "checkpoints" / "step_00000005.ckpt"
    while not first.exists() and interrupted.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    interrupted.send_signal(signal.SIGINT)
    _, err = interrupted.communicate(timeout=120)
    assert interrupted.returncode == 128 + signal.SIGINT, err[-3000:]
    stopped = [line for line in err.splitlines() if "stopped by SIGINT after step" in line]
    assert stopped and "trainer.resume=auto" in stopped[0], err[-3000:]
    step = int(stopped[0].split("after step ")[1].split(":")[0])
    assert (tmp_path / "ctrl_c" / "checkpoints" / f"step_{step:08d}.ckpt").exists()
    assert (tmp_path / "ctrl_c" / "hf" / f"step_{step}" / "model.safetensors").exists()
    assert not (tmp_path / "ctrl_c" / "hf" / "final").exists()
    run_cli(tmp_path, "ctrl_c", *args, "trainer.resume=auto")
    after_ctrl_c = weights(tmp_path / "ctrl_c")
    assert max(float((straight[k] - after_ctrl_c[k]).abs().max()) for k in straight) == 0.0
