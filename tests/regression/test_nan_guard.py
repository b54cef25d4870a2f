"""F3: non-finite values never reach the weights; they are counted; persistent ones stop training."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from conftest import make_generator

import grpo_lightning.algorithm.objective as objective_lib
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.data import PromptDataModule
from grpo_lightning.step.guards import NonFiniteTrainingError
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.tasks import arithmetic_records


class Snapshots(L.Callback):
    """Parameters and Adam state before and after every training step."""

    def __init__(self):
        self.before, self.after = [], []

    @staticmethod
    def _state(module):
        params = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        opt = module.optimizers().optimizer.state
        moments = {id(p): s["exp_avg"].clone() for p, s in opt.items() if "exp_avg" in s}
        return params, moments

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.before.append(self._state(module))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after.append(self._state(module))


def fit(policy, tokenizer, steps, *extra_callbacks, **algorithm):
    module, trainer, snapshots, run = prepared_fit(policy, tokenizer, steps, *extra_callbacks, **algorithm)
    run()
    return module, trainer, snapshots


def prepared_fit(policy, tokenizer, steps, *extra_callbacks, **algorithm):
    """The module, trainer and snapshots of a short fit, and the call that runs it."""
    train, _ = arithmetic_records()
    data = PromptDataModule(train, prompts_per_step=4, num_batches=steps)
    rollout = make_generator(policy, tokenizer, max_new_tokens=4, rewards={"test_length": 1.0})
    module = GRPOModule(policy, AlgorithmConfig(**{"micro_batch_size": 16, "lr": 1e-2, **algorithm}), rollout=rollout)
    snapshots = Snapshots()
    trainer = L.Trainer(
        accelerator="cpu",  # on a GPU machine "auto" moved the fit to CUDA and back, and snapshots apart
        max_steps=steps,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[snapshots, *extra_callbacks],
    )
    return module, trainer, snapshots, lambda: trainer.fit(module, datamodule=data)


def all_finite(module):
    return all(torch.isfinite(p).all() for p in module.policy.parameters())


def changed(before, after):
    return any(not torch.equal(before[0][n], after[0][n]) for n in before[0])


# "lm_head": NaN logits from a hooked head (the checkpointed log-prob path); "final_norm": NaN
# hidden states into the plain head (the fused head + log-softmax function), unpacked so that
# poisoning row 0 of the decoder's output poisons one sequence only.
@pytest.mark.parametrize("poisoned", ["lm_head", "final_norm"])
def test_nan_logits_in_one_sample_drop_that_sample_and_training_goes_on(policy, tokenizer, poisoned):
    calls = {"n": 0}

    def poison_row_zero_once(mod, inputs, output):
        if not torch.is_grad_enabled():  # generation and frozen log-probs: leave alone
            return output
        calls["n"] += 1
        if calls["n"] == 1:  # the first training forward only
            output = output.clone()
            output[0] = float("nan")
            return output

    layer = policy.lm_head if poisoned == "lm_head" else policy.model.norm
    handle = layer.register_forward_hook(poison_row_zero_once)
    try:
        module, trainer, snaps = fit(policy, tokenizer, 3, beta=0.0, pack_sequences=poisoned == "lm_head")
    finally:
        handle.remove()
    assert module.counters.nonfinite_seqs == 1
    assert module.counters.skipped_steps == 0  # the other 15 sequences still trained the policy
    assert trainer.global_step == 3
    assert changed(snaps.before[0], snaps.after[0])
    assert all_finite(module)


def test_nan_loss_skips_the_step_without_touching_weights_or_optimizer(policy, tokenizer, monkeypatch):
    real_aggregate, state = objective_lib.aggregate, {"batch": -1}

    class BatchIndex(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            state["batch"] = batch_idx

    def nan_in_second_step(*args, **kwargs):
        loss = real_aggregate(*args, **kwargs)
        return loss * float("nan") if state["batch"] == 1 else loss

    monkeypatch.setattr(objective_lib, "aggregate", nan_in_second_step)
    module, trainer, snaps = fit(policy, tokenizer, 4, BatchIndex(), beta=0.04)
    assert module.counters.skipped_steps == 1 and module.counters.nonfinite_losses == 1
    params_before, moments_before = snaps.before[1]
    params_after, moments_after = snaps.after[1]
    assert all(torch.equal(params_before[n], params_after[n]) for n in params_before)
    assert all(torch.equal(moments_before[k], moments_after[k]) for k in moments_before)
    assert changed(snaps.before[2], snaps.after[2])  # training continued after the skip
    assert trainer.global_step == 3  # 4 batches, one step skipped
    assert all_finite(module)


def test_nan_gradient_skips_the_step(policy, tokenizer):
    calls = {"n": 0}

    def nan_grad_on_first_backward(grad):
        calls["n"] += 1
        return grad * float("nan") if calls["n"] == 1 else grad

    policy.model.embed_tokens.weight.register_hook(nan_grad_on_first_backward)
    module, trainer, snaps = fit(policy, tokenizer, 3, beta=0.0)
    assert module.counters.nonfinite_grads == 1 and module.counters.skipped_steps == 1
    assert not changed(snaps.before[0], snaps.after[0])
    assert changed(snaps.before[1], snaps.after[1])
    assert all_finite(module)


def test_consecutive_non_finite_steps_stop_training_with_a_diagnosis(policy, tokenizer, monkeypatch):
    real_aggregate = objective_lib.aggregate
    monkeypatch.setattr(objective_lib, "aggregate", lambda *a, **k: real_aggregate(*a, **k) * float("nan"))
    with pytest.raises(NonFiniteTrainingError) as info:
        fit(policy, tokenizer, 10, beta=0.0, max_consecutive_skips=3)
    message = str(info.value)
    assert "3 consecutive optimizer steps were skipped" in message
    assert "loss was non-finite" in message
    assert "algorithm.lr" in message and "No non-finite value was written" in message
    assert all(torch.isfinite(p).all() for p in policy.parameters())
