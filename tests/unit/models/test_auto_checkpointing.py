"""model.gradient_checkpointing=auto: on exactly when the activations would not fit, said aloud, same gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import fit

from grpo_lightning.config import ModelConfig, validate_config
from grpo_lightning.models import auto_checkpointing, load_policy
from grpo_lightning.models.auto_checkpointing import activation_bytes, choose_checkpointing


def test_activation_estimate_grows_with_the_batch(policy):
    one = activation_bytes(policy, 1, 16)
    assert activation_bytes(policy, 4, 16) == 4 * one
    assert activation_bytes(policy, 1, 32) > 2 * one  # and a little more: attention rows grow too
    # tiny Llama: 2 layers, hidden 64, intermediate 128, 2 heads, float32
    assert one == 16 * 2 * (10 * 64 + 4 * 128 + 3 * 64 + 2 * 16) * 4


def test_choice_turns_on_when_activations_exceed_half_of_free_memory(policy, monkeypatch):
    needed = activation_bytes(policy, 8, 40)
    for free, expected in [(needed, True), (2 * needed - 1, True), (2 * needed + 1, False), (100 * needed, False)]:
        monkeypatch.setattr(auto_checkpointing, "available_bytes", lambda device, free=free: free)
        choice = choose_checkpointing(policy, 8, 40, torch.device("cpu"))
        assert choice.on is expected, (free, needed)
        assert ("auto: on" if expected else "auto: off") in choice.report()
        assert "8 rows x 40 tokens" in choice.report()


@pytest.mark.parametrize("free_factor, expected", [(0.1, True), (1000.0, False)])
def test_auto_sets_checkpointing_on_the_policy_during_training(config_factory, monkeypatch, free_factor, expected):
    recorded = {}

    def fake_available(device):
        return int(recorded["needed"] * free_factor)

    real_choose = auto_checkpointing.choose_checkpointing

    def spy(model, rows, width, device):
        recorded["needed"] = activation_bytes(model, rows, width)
        choice = real_choose(model, rows, width, device)
        recorded.setdefault("choices", []).append(choice.on)
        return choice

    monkeypatch.setattr(auto_checkpointing, "available_bytes", fake_available)
    monkeypatch.setattr("grpo_lightning.step.module.choose_checkpointing", spy)
    cfg = config_factory(2, **{"model.gradient_checkpointing": "auto"})
    run = fit(cfg)
    assert recorded["choices"] == [expected, expected]  # decided every step
    assert run.module.policy.is_gradient_checkpointing is expected
    assert run.module.checkpointing_choice.on is expected


def test_explicit_modes_and_hydra_booleans():
    on, _ = load_policy(ModelConfig(name_or_path="tiny", gradient_checkpointing="True"))  # Hydra's `=true`
    off, _ = load_policy(ModelConfig(name_or_path="tiny", gradient_checkpointing=False))
    auto, _ = load_policy(ModelConfig(name_or_path="tiny", gradient_checkpointing="auto"))
    assert on.is_gradient_checkpointing and not off.is_gradient_checkpointing and not auto.is_gradient_checkpointing


def test_an_unknown_mode_is_an_error_naming_the_field(config_factory):
    cfg = config_factory(1, **{"model.gradient_checkpointing": "sometimes"})
    with pytest.raises(
        ValueError,
        match=r"model.gradient_checkpointing='sometimes' is not allowed; choose one of \['auto', 'true', 'false'\]",
    ):
        validate_config(cfg)


def test_cuda_free_memory_counts_what_the_caching_allocator_holds_unused(monkeypatch):
    """Regression (seen on an H100): free memory read from the driver alone missed the blocks
    the first step's activations left cached, and auto switched checkpointing on from the
    second step for a batch that fitted."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 40 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 5 * gib)
    assert auto_checkpointing.available_bytes(torch.device("cuda", 0)) == 45 * gib
