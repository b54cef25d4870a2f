"""AdamW runs fused (TRL's default, one kernel per group) wherever torch supports it, and only there."""

from __future__ import annotations

import torch

from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.step.module import GRPOModule, adamw_can_fuse


def test_the_policy_trains_with_fused_adamw_on_cpu(policy):
    optimizer = GRPOModule(policy, AlgorithmConfig(beta=0.0)).configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"] is True
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in policy.parameters() if p.requires_grad}


def test_fused_only_for_plain_floating_point_parameters_on_cpu_or_cuda():
    plain = torch.nn.Parameter(torch.zeros(3))
    assert adamw_can_fuse([plain, torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])
    assert not adamw_can_fuse([])
    assert not adamw_can_fuse([plain, torch.nn.Parameter(torch.zeros(2, device="meta"))])
    assert not adamw_can_fuse([plain, torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)])

    class ShardedParameter(torch.nn.Parameter):  # what FSDP2's DTensor parameters look like to the check
        pass

    assert not adamw_can_fuse([plain, ShardedParameter(torch.zeros(2))])


def test_a_fused_step_matches_the_reference_implementation():
    """Same update as torch's for-loop AdamW (to float rounding) over a few steps."""
    torch.manual_seed(0)
    weights = [torch.randn(5, 7), torch.randn(7)]
    grads = [[torch.randn_like(w) for w in weights] for _ in range(4)]
    results = []
    for fused in (True, None):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=fused)
        for step in grads:
            for p, g in zip(params, step, strict=True):
                p.grad = g.clone()
            optimizer.step()
        results.append([p.detach() for p in params])
    for fused, plain in zip(*results, strict=True):
        torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-7)
