"""F4 and F5 on the real module: exact gradient accumulation, and a zero loss with a gradient."""

from __future__ import annotations

import pytest
import torch
from conftest import fit, gradients

from grpo_lightning.algorithm import LOSS_AGG_MODES
from grpo_lightning.config import AlgorithmConfig, ModelConfig
from grpo_lightning.models import load_policy
from grpo_lightning.step.module import GRPOModule


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_one_micro_batch_of_16_equals_16_micro_batches_of_one(policy, rollout, mode, beta):
    assert rollout.num_sequences == 16
    whole, whole_stats = gradients(policy, rollout, micro_batch_size=16, loss_agg=mode, beta=beta)
    split, split_stats = gradients(policy, rollout, micro_batch_size=1, loss_agg=mode, beta=beta)
    assert whole.keys() == split.keys() and len(whole) > 0
    for name in whole:
        scale = whole[name].abs().max().clamp(min=1e-8)
        assert (whole[name] - split[name]).abs().max() / scale < 1e-5, name
    assert split_stats.loss == pytest.approx(whole_stats.loss, abs=1e-6)
    assert sum(g.abs().sum() for g in whole.values()) > 0


def test_loss_is_zero_but_gradient_is_not_with_beta_zero_one_iteration_seq_mean(policy, rollout):
    grads, stats = gradients(
        policy, rollout, beta=0.0, num_iterations=1, loss_agg="seq_mean_token_mean", micro_batch_size=4
    )
    assert abs(stats.loss) < 1e-6
    assert sum(float(g.norm()) for g in grads.values()) > 1e-4


def test_no_reference_model_without_kl(policy):
    assert GRPOModule(policy, AlgorithmConfig(beta=0.0)).reference is None
    with_kl = GRPOModule(policy, AlgorithmConfig(beta=0.1))
    assert with_kl.reference is not None
    assert not any(p.requires_grad for p in with_kl.reference.parameters())


def test_reference_stays_in_eval_mode_when_the_module_trains(policy):
    module = GRPOModule(policy, AlgorithmConfig(beta=0.1))
    module.train()
    assert module.policy.training and not module.reference.training


def test_gradient_checkpointing_gives_the_same_gradients(tokenizer, rollout):
    plain, _ = load_policy(ModelConfig(name_or_path="tiny"))
    checkpointed, _ = load_policy(ModelConfig(name_or_path="tiny", gradient_checkpointing=True))
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    plain.train(), checkpointed.train()
    expected, _ = gradients(plain, rollout, micro_batch_size=8, beta=0.1)
    actual, _ = gradients(checkpointed, rollout, micro_batch_size=8, beta=0.1)
    for name in expected:
        assert torch.allclose(expected[name], actual[name], atol=1e-6, rtol=1e-5), name


def test_the_policy_trains_in_train_mode_with_checkpointing_active(config_factory, tmp_path):
    """Regression: ``from_pretrained`` hands back the policy in eval mode and Lightning does not
    switch it to train mode, so gradient checkpointing (and dropout) silently did nothing:
    SmolLM2's step used ~3x the activation memory it was configured for."""
    saved, tok = load_policy(ModelConfig(name_or_path="tiny"))
    saved.save_pretrained(tmp_path), tok.save_pretrained(tmp_path)
    modes, recomputed = [], []

    def record(run):
        layer = run.module.policy.model.layers[0]
        layer.register_forward_pre_hook(lambda mod, args: modes.append((torch.is_grad_enabled(), mod.training)))
        inner = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, **k: recomputed.append(1) or inner(*a, **k)

    cfg = config_factory(2, **{"model.name_or_path": str(tmp_path), "model.gradient_checkpointing": True})
    fit(cfg, prepare=record)
    with_grad = [training for grad_enabled, training in modes if grad_enabled]
    assert with_grad and all(with_grad), modes
    assert len(recomputed) >= 2  # one checkpointed layer call per training forward
