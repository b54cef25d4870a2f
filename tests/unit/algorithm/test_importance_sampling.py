"""Truncated importance sampling: the math, and that with IS off the module is unchanged."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning.algorithm import truncated_importance_weights
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import RolloutBatch
from grpo_lightning.step.module import GRPOModule


def test_token_level_weights_are_truncated_ratios():
    trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1, 1, 0]])
    out = truncated_importance_weights(trainer, engine, mask, "token", cap=1.5)
    assert torch.allclose(out.weights[0, :2], torch.tensor([1.5, math.exp(-1.0)]))  # e^0.5 = 1.65 -> 1.5
    assert out.ratio_max == pytest.approx(math.exp(0.5))
    assert out.truncated == 1
    assert out.abs_diff_sum == pytest.approx(1.5)  # the masked token does not count


def test_sequence_level_weight_is_one_truncated_product_per_sequence():
    trainer = torch.tensor([[-1.0, -1.0], [-1.0, -3.0]])
    engine = torch.tensor([[-1.2, -1.1], [-1.0, -1.0]])
    mask = torch.ones(2, 2)
    out = truncated_importance_weights(trainer, engine, mask, "sequence", cap=10.0)
    assert torch.allclose(out.weights[0], torch.full((2,), math.exp(0.3)))
    assert torch.allclose(out.weights[1], torch.full((2,), math.exp(-2.0)))


def test_weights_are_detached_and_none_level_is_all_ones():
    trainer = torch.randn(2, 3, requires_grad=True)
    out = truncated_importance_weights(trainer, torch.randn(2, 3), torch.ones(2, 3), "token", 2.0)
    assert not out.weights.requires_grad
    none = truncated_importance_weights(trainer, torch.randn(2, 3), torch.ones(2, 3), "none", 2.0)
    assert torch.equal(none.weights, torch.ones(2, 3))
    with pytest.raises(ValueError):
        truncated_importance_weights(trainer, trainer, torch.ones(2, 3), "tokens", 2.0)


def _rollout(engine_logprobs: torch.Tensor | None) -> RolloutBatch:
    generator = torch.Generator().manual_seed(0)
    n, c = 8, 4
    return RolloutBatch(
        prompt_ids=torch.randint(3, 19, (n, 3), generator=generator),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.randint(3, 19, (n, c), generator=generator),
        completion_mask=torch.ones(n, c, dtype=torch.long),
        rewards=torch.rand(n, generator=generator),
        group_size=4,
        max_new_tokens=c,
        temperature=1.0,
        engine_logprobs=engine_logprobs,
    )


def _gradient(level: str, engine_logprobs: torch.Tensor | None) -> torch.Tensor:
    tokenizer = build_char_tokenizer()
    module = GRPOModule(build_tiny_policy(tokenizer), AlgorithmConfig(beta=0.0, is_level=level, micro_batch_size=4))
    rollout = _rollout(engine_logprobs)
    module.accumulate_gradients(rollout, module.prepare(rollout))
    return torch.cat([p.grad.flatten() for p in module.policy.parameters() if p.grad is not None])


def test_with_is_off_engine_logprobs_change_nothing():
    shifted = torch.full((8, 4), -5.0)  # far from the trainer's: would reweight if IS were on
    base = _gradient("none", None)
    assert torch.equal(_gradient("none", shifted), base)
    assert not torch.allclose(_gradient("token", shifted), base)
