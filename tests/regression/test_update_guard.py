"""F3 for the update: finite gradients that would make non-finite weights (lr=1e39) never reach
them; the trial step leaves weights and optimizer state bit-identical and predicts the real one."""

from __future__ import annotations

import random

import pytest
import torch
from test_nan_guard import all_finite, prepared_fit

from grpo_lightning.step import update_check
from grpo_lightning.step.guards import NonFiniteTrainingError
from grpo_lightning.step.update_check import nonfinite_update_count


def test_a_huge_learning_rate_never_writes_inf_weights_and_the_message_is_true(policy, tokenizer):
    module, trainer, snaps, run = prepared_fit(policy, tokenizer, 10, lr=1e39, beta=0.0, max_consecutive_skips=3)
    with pytest.raises(NonFiniteTrainingError) as info:
        run()
    message = str(info.value)
    assert "would have made weights non-finite" in message and "algorithm.lr=1e+39" in message
    assert "No non-finite value was written into the weights" in message
    assert module.counters.nonfinite_updates == 3 and module.counters.skipped_steps == 3
    assert trainer.global_step == 0
    assert all_finite(module)
    first = snaps.before[0][0]
    assert all(torch.equal(first[n], p) for n, p in module.policy.named_parameters())
    assert not module.optimizers().optimizer.state  # no Adam moment was kept either


def test_a_normal_learning_rate_trains_as_before(policy, tokenizer):
    module, trainer, snaps, run = prepared_fit(policy, tokenizer, 2, beta=0.0)
    run()
    assert trainer.global_step == 2 and module.counters.nonfinite_updates == 0
    assert any(not torch.equal(snaps.before[0][0][n], snaps.after[0][0][n]) for n in snaps.before[0][0])


@pytest.mark.parametrize("min_chunk", [0, update_check.MIN_CHUNK_ELEMENTS], ids=["chunked", "one_chunk"])
@pytest.mark.parametrize("fused", [True, False])
def test_the_trial_step_predicts_the_real_one_and_changes_nothing(fused, min_chunk, monkeypatch):
    """Many random cases: lr from tiny to overflowing, first and later steps, weight decay; tried
    in several chunks (as a large model is) and in one (a small one)."""
    monkeypatch.setattr(update_check, "MIN_CHUNK_ELEMENTS", min_chunk)
    rng = random.Random(0)
    for case in range(60):
        torch.manual_seed(case)
        params = [torch.nn.Parameter(torch.randn(rng.randint(1, 5), 3) * 10 ** rng.uniform(-3, 30)) for _ in range(3)]
        lr = 10 ** rng.uniform(-6, 40)
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=rng.choice([0.0, 0.1]), fused=fused or None)
        for _ in range(rng.randint(0, 2)):  # some cases start from existing Adam state
            for p in params:
                p.grad = torch.randn_like(p)
            with torch.no_grad():
                opt.param_groups[0]["lr"] = 1e-3
                opt.step()
                opt.param_groups[0]["lr"] = lr
        for p in params:
            p.grad = torch.randn_like(p) * 10 ** rng.uniform(-3, 3)
        before = [p.detach().clone() for p in params]
        state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
        count = int(nonfinite_update_count(opt))
        assert all(torch.equal(b, p) for b, p in zip(before, params, strict=True))
        assert {id(p) for p in opt.state} == state.keys()
        for p, s in opt.state.items():
            assert all(torch.equal(v, state[id(p)][k]) for k, v in s.items())
        try:
            with torch.no_grad():
                opt.step()
        except RuntimeError:  # the real step overflows before writing a weight: the trial said so
            assert count > 0, (case, lr)
            continue
        real_bad = sum(
            int(not torch.isfinite(t).all())
            for p in params
            for t in [p, *(v for v in opt.state[p].values() if v.is_floating_point())]
        )
        assert count == real_bad, (case, lr)
