"""num_iterations > 1: the old policy's log-probs come from the first pass, not a separate forward."""

from __future__ import annotations

import copy

import torch
from conftest import fit

from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.step.module import GRPOModule


def test_first_pass_records_the_old_log_probs_a_separate_forward_would_give(policy, rollout):
    module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(num_iterations=2, beta=0.0, micro_batch_size=4))
    module.policy.train()
    prepared = module.prepare(rollout)
    assert prepared.old is None  # nothing computed ahead of the first backward
    separate = module._frozen_log_probs(module.policy, rollout, prepared.micro_batches)
    stats = module.accumulate_gradients(rollout, prepared, record_old=True)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(stats.old_logprobs.logp[mask], separate.logp[mask], atol=1e-6, rtol=0)
    assert torch.equal(stats.old_logprobs.finite[mask], separate.finite[mask])


class CountingForward:
    """Wraps the module's forward pass, counting calls; everything else passes through."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_two_iteration_step_runs_one_policy_forward_per_pass_and_micro_batch(config_factory):
    def count(run):
        run.module.forward_pass = CountingForward(run.module.forward_pass)

    cfg = config_factory(2, **{"algorithm.num_iterations": 2, "algorithm.beta": 0.0, "algorithm.micro_batch_size": 32})
    run = fit(cfg, prepare=count)
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.num_generations // cfg.algorithm.micro_batch_size
    generation_batches = run.fitted.global_step // 2  # each generation batch gives two optimizer steps
    assert run.module.forward_pass.calls == generation_batches * 2 * per_step
    # the second pass saw the weights the first pass's step produced (its log-probs moved)
    first, second = (p.seq_logp for p in run.module.last_step.passes)
    assert not torch.allclose(first, second)
