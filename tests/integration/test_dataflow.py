"""Data flows one way through the module: a plain Trainer, with no callback of ours, trains and
validates the hand-assembled pieces exactly as the CLI's build does (the README's API)."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from conftest import PROMPTS, make_generator
from torch.utils.data import DataLoader

from grpo_lightning import GRPOModule, HFEngine, RolloutGenerator, Sampling
from grpo_lightning.config import AlgorithmConfig, RolloutConfig
from grpo_lightning.data import PromptDataModule
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.tasks import arithmetic_records


def hand_assembled(correctness_reward: str | None):
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    rollout = RolloutGenerator(
        engine=HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names({"arithmetic_exact": 0.5, "arithmetic_close": 0.5}),
        num_generations=4,
        sampling=Sampling.from_config(RolloutConfig(max_new_tokens=4)),
    )
    module = GRPOModule(
        policy, AlgorithmConfig(micro_batch_size=16), rollout=rollout, correctness_reward=correctness_reward
    )
    train, val = arithmetic_records()
    return module, PromptDataModule(train, val[:8], prompts_per_step=4, num_batches=3, val_batch_size=8)


def plain_trainer(max_steps: int = 3, **kwargs) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def test_a_plain_trainer_trains_and_validates_the_hand_assembled_pieces():
    module, data = hand_assembled("arithmetic_exact")
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    trainer = plain_trainer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=data)
    assert trainer.global_step == 3
    assert any(not torch.equal(before[k], v) for k, v in module.policy.state_dict().items())
    assert module.last_step.rollout.num_sequences == 16
    # Every step metric is the module's last_metrics (and goes to the loggers); the ones callbacks
    # monitor are also Lightning's callback metrics.
    assert {"reward/mean", "reward/frac_zero_std", "policy/entropy", "completions/mean_length"} <= set(
        module.last_metrics
    )
    assert float(trainer.callback_metrics["reward/mean"]) == pytest.approx(module.last_metrics["reward/mean"])
    assert 0.0 <= float(trainer.callback_metrics["val/accuracy"]) <= 1.0
    assert len(module.evaluator.last_samples) == 8


def test_validation_without_a_correctness_reward_is_an_error_not_a_silent_no_op():
    module, data = hand_assembled(correctness_reward=None)
    with pytest.raises(RuntimeError, match="correctness_reward=<reward function name>"):
        plain_trainer().validate(module, datamodule=data, verbose=False)


def test_prompt_records_without_a_generator_name_the_fix():
    module, data = hand_assembled("arithmetic_exact")
    module.rollout = None
    with pytest.raises(RuntimeError, match="pass rollout=RolloutGenerator"):
        plain_trainer(limit_val_batches=0).fit(module, datamodule=data)


def test_a_loader_of_ready_rollout_batches_needs_no_generator(policy, tokenizer):
    """Batches generated elsewhere (another process, a replay buffer) reach the step as its batch."""
    generator = make_generator(policy, tokenizer)
    batches = [generator.generate(PROMPTS, step=i, rank=0) for i in range(2)]
    for batch in batches:
        batch.rewards = torch.rand(batch.num_sequences, generator=torch.Generator().manual_seed(batch.step))
    module = GRPOModule(policy, AlgorithmConfig(micro_batch_size=16))
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    loader = DataLoader(batches, batch_size=None, collate_fn=lambda b: b)
    trainer = plain_trainer(max_steps=2, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 2 and module.last_step.rollout is not None
    assert module.last_step.rollout.step == 1
    assert any(not torch.equal(before[k], v) for k, v in module.policy.state_dict().items())
