"""Helpers for the vLLM tests: tiny runs through the real build path, and the F1 diversity check."""

from __future__ import annotations

import lightning as L
import torch

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.data import PromptDataModule
from grpo_lightning.models import build_tiny_policy
from grpo_lightning.rollout import RolloutBatch


class RolloutRecorder(L.Callback):
    """Keeps every generation batch the module trained on, in step order."""

    def __init__(self):
        self.batches: list[RolloutBatch] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches.append(pl_module.last_step.rollout)


def small_config(
    steps: int, mode: str = "sync", staleness: int = 1, max_new_tokens: int = 8, lr: float = 3e-4
) -> TrainConfig:
    cfg = TrainConfig()
    cfg.logger.kind = "none"
    cfg.trainer.max_steps = steps
    # output_dir stays the default ./outputs: each test runs in its own folder (tests/conftest.py)
    cfg.rollout.engine = "vllm"
    cfg.rollout.mode = mode
    cfg.rollout.max_staleness = staleness
    cfg.rollout.prompts_per_step = 4
    cfg.rollout.num_generations = 8
    cfg.rollout.max_new_tokens = max_new_tokens
    cfg.algorithm.micro_batch_size = 32
    cfg.algorithm.lr = lr
    # Every sync of these runs (after each GRPO optimizer step) is checked against the policy.
    cfg.rollout.vllm.verify_sync = True
    cfg.rollout.vllm.verify_tolerance = 1e-4
    return cfg


def run_training(cfg: TrainConfig, engine, records: list[dict] | None = None) -> list[RolloutBatch]:
    """Fit with the session engine; ``records`` replaces the task's prompts (all used every step)."""
    run = build_run(cfg, engine=engine)
    datamodule = run.datamodule
    if records is not None:
        lookahead = cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0
        datamodule = PromptDataModule(
            records, None, len(records), seed=cfg.trainer.seed, num_batches=cfg.trainer.max_steps, lookahead=lookahead
        )
    recorder = RolloutRecorder()
    trainer = run.trainer(cfg, callbacks=run.callbacks + [recorder], enable_progress_bar=False)
    trainer.fit(run.module, datamodule=datamodule)
    return recorder.batches


def completions_by_prompt(batch: RolloutBatch) -> dict[str, list[tuple[int, ...]]]:
    """Prompt text -> the token ids of its group's completions."""
    groups: dict[str, list[tuple[int, ...]]] = {}
    for row, prompt in enumerate(batch.prompts):
        ids = batch.completion_ids[row][batch.completion_mask[row].bool()].tolist()
        groups.setdefault(prompt, []).append(tuple(ids))
    return groups


def diversity_failures(batches: list[RolloutBatch], min_distinct_fraction: float = 0.75) -> list[str]:
    """The F1 check: every failure it finds, as text; an empty list means the batches are healthy.

    At temperature 1 on the (nearly uniform) tiny policy, a group's samples must be mostly
    distinct and never all identical, and a prompt seen at two consecutive steps must not get
    the same completions again. Fixing every request's seed to one constant breaks all three.
    """
    failures = []
    for step, batch in enumerate(batches):
        for prompt, samples in completions_by_prompt(batch).items():
            distinct = len(set(samples))
            if distinct == 1:
                failures.append(f"step {step}: every sample of {prompt!r} is identical")
            elif distinct < min_distinct_fraction * len(samples):
                failures.append(f"step {step}: only {distinct}/{len(samples)} distinct samples of {prompt!r}")
    for step in range(1, len(batches)):
        before, now = completions_by_prompt(batches[step - 1]), completions_by_prompt(batches[step])
        for prompt in before.keys() & now.keys():
            if sorted(before[prompt]) == sorted(now[prompt]):
                failures.append(f"steps {step - 1} and {step}: {prompt!r} got the same completions again")
    return failures


def perturbed_policy(tokenizer, seed: int = 0, steps: int = 3, lr: float = 1e-2):
    """The tiny policy after a few AdamW steps on a next-token loss: weights that differ from init."""
    policy = build_tiny_policy(tokenizer, seed=seed)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    text = tokenizer(["1+2=3", "4+4=8", "7+1=8", "2+2=4"], return_tensors="pt")["input_ids"]
    for _ in range(steps):
        loss = policy(input_ids=text, labels=text).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy
