"""The corrections inside the GRPO step: masks leave the loss, bypass mode takes the engine as old."""

from __future__ import annotations

import torch

from grpo_lightning.algorithm.corrections.geo_mask import GeoMaskOptions
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import RolloutBatch
from grpo_lightning.step.module import GRPOModule


def _rollout(engine_logprobs: torch.Tensor) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    n, c = 8, 4
    return RolloutBatch(
        prompt_ids=torch.randint(3, 19, (n, 3), generator=g),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.randint(3, 19, (n, c), generator=g),
        completion_mask=torch.ones(n, c, dtype=torch.long),
        rewards=torch.rand(n, generator=g),
        group_size=4,
        max_new_tokens=c,
        temperature=1.0,
        engine_logprobs=engine_logprobs,
    )


def _pass(cfg: AlgorithmConfig, engine: torch.Tensor):
    torch.manual_seed(0)
    module = GRPOModule(build_tiny_policy(build_char_tokenizer()), cfg)
    rollout = _rollout(engine)
    stats = module.accumulate_gradients(rollout, module.prepare(rollout))
    grad = torch.cat([p.grad.flatten() for p in module.policy.parameters() if p.grad is not None])
    return stats, grad


def test_a_sequence_mask_removes_the_far_rows_from_the_loss():
    engine = torch.full((8, 4), -3.0)
    engine[:4] = -30.0  # the first four rows drift far: their geometric-mean ratio is huge
    cfg = AlgorithmConfig(beta=0.0, micro_batch_size=4, corrections=["geo_mask"])
    cfg.geo_mask = GeoMaskOptions(lower=1e-3, upper=1e3)
    stats, _ = _pass(cfg, engine)
    # engine -3 is within a factor 1e3 of the tiny model's ~-2.9 log-probs: those rows stay
    assert stats.kept_tokens == 16


def test_bypass_mode_takes_the_engine_logprobs_as_old():
    engine = torch.full((8, 4), -3.0)
    _, decoupled = _pass(AlgorithmConfig(beta=0.0, micro_batch_size=4), engine)
    _, bypass = _pass(AlgorithmConfig(beta=0.0, micro_batch_size=4, correction_mode="bypass"), engine)
    assert not torch.allclose(decoupled, bypass)  # the ratio is pi_theta / pi_eng, not 1
