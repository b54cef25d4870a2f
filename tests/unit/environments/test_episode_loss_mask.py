"""The loss mask drives every term of the loss: environment tokens never reach the loss, its gradient,
its normalizer or the importance weights, in every aggregation mode and policy loss."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from grpo_lightning.algorithm import (
    IS_LEVELS,
    MicroBatch,
    PreparedBatch,
    TokenLogProbs,
    loss_normalizer,
    micro_batch_loss,
)
from grpo_lightning.algorithm.aggregation import LOSS_AGG_MODES
from grpo_lightning.algorithm.policy_loss import POLICY_LOSSES
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.records import RolloutBatch
from grpo_lightning.step.module import GRPOModule

HORIZON = 16


def layout(sampled: list[list[int]], env_lengths: list[list[int]]) -> tuple[torch.Tensor, list[list[int]]]:
    """[B, C] loss mask of rows that interleave sampled turns (their lengths) and environment replies;
    also each row's positions of sampled tokens, in order."""
    rows, positions = [], []
    for turns, envs in zip(sampled, env_lengths, strict=True):
        mask: list[int] = []
        for n, e in itertools.zip_longest(turns, envs, fillvalue=0):
            mask += [1] * n + [0] * e
        rows.append(mask)
        positions.append([i for i, m in enumerate(mask) if m])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.bool), positions


def scatter(values: torch.Tensor, positions: list[list[int]], shape, fill: torch.Tensor) -> torch.Tensor:
    """[B, C] with the sampled tokens' ``values`` [B, S] at ``positions`` and ``fill`` elsewhere."""
    out = fill.clone()
    for row, cols in enumerate(positions):
        out[row, cols] = values[row, : len(cols)]
    return out


def loss_and_grad(cfg: AlgorithmConfig, mask, positions, sampled_values, fill_seed: int):
    """The loss of one micro-batch and d loss / d (sampled tokens' policy log-probs), with arbitrary
    values (from ``fill_seed``) at every environment position of every input."""
    g = torch.Generator().manual_seed(fill_seed)
    shape = mask.shape
    noise = lambda: torch.randn(shape, generator=g) * 3 - 2  # noqa: E731
    policy_values, old_values, ref_values, engine_values = sampled_values
    leaf = policy_values.clone().requires_grad_(True)
    logp = scatter(leaf, positions, shape, noise())
    finite = torch.ones(shape, dtype=torch.bool)
    old = TokenLogProbs(scatter(old_values, positions, shape, noise()), None, finite)
    ref = TokenLogProbs(scatter(ref_values, positions, shape, noise()), None, finite)
    mb = MicroBatch(
        rows=slice(0, shape[0]),
        input_ids=torch.zeros(shape[0], shape[1] + 1, dtype=torch.long),
        attention_mask=torch.ones(shape[0], shape[1] + 1, dtype=torch.long),
        prompt_width=1,
        completion_mask=mask,
        engine_logprobs=scatter(engine_values, positions, shape, noise()),
    )
    prepared = PreparedBatch(
        micro_batches=[mb],
        advantages=torch.tensor([1.0, -0.5, 0.25]),
        normalizer=loss_normalizer(mask.float(), cfg.loss_agg, HORIZON),
        max_new_tokens=HORIZON,
        reference=ref,
        old=old,
    )
    terms = micro_batch_loss(TokenLogProbs(logp, None, finite), mb, prepared, cfg)
    (grad,) = torch.autograd.grad(terms.loss, leaf)
    return terms.loss.detach(), grad


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_environment_tokens_change_neither_loss_nor_gradient_and_longer_replies_change_nothing(mode):
    sampled = [[3, 2], [1, 4, 1], [5]]
    short, short_pos = layout(sampled, [[2, 1], [1, 1, 0], [3]])
    long, long_pos = layout(sampled, [[7, 9], [4, 2, 5], [1]])
    g = torch.Generator().manual_seed(0)
    values = [-torch.rand(3, 6, generator=g) * 2 for _ in range(4)]  # policy, old, reference, engine
    for policy_loss, is_level in itertools.product(POLICY_LOSSES, IS_LEVELS):
        cfg = AlgorithmConfig(loss_agg=mode, policy_loss=policy_loss, beta=0.1, is_level=is_level)
        base_loss, base_grad = loss_and_grad(cfg, short, short_pos, values, fill_seed=1)
        assert base_grad.abs().sum() > 0
        for m, pos, seed in ((short, short_pos, 2), (long, long_pos, 3), (long, long_pos, 4)):
            loss, grad = loss_and_grad(cfg, m, pos, values, fill_seed=seed)
            torch.testing.assert_close(loss, base_loss, msg=f"{mode} {policy_loss} {is_level}: loss moved")
            torch.testing.assert_close(grad, base_grad, msg=f"{mode} {policy_loss} {is_level}: gradient moved")


def test_normalizers_count_sampled_tokens_only():
    sampled = [[3, 2], [1, 4, 1], [5]]
    short, _ = layout(sampled, [[2, 1], [1, 1, 0], [3]])
    long, _ = layout(sampled, [[7, 9], [4, 2, 5], [1]])
    for mode in LOSS_AGG_MODES:
        assert float(loss_normalizer(short.float(), mode, HORIZON)) == float(
            loss_normalizer(long.float(), mode, HORIZON)
        )
    assert float(loss_normalizer(long.float(), "token_mean", HORIZON)) == sum(map(sum, sampled))


def rollout_with_tail(env_tail: list[int], seed: int = 0) -> RolloutBatch:
    """Two rows of a group: sampled ids, then environment ids (mask 0) at the end, where they cannot
    change the policy's log-probs of the sampled ids (causal attention)."""
    g = torch.Generator().manual_seed(seed)
    sampled = torch.randint(3, 15, (2, 5), generator=g)
    tail = torch.tensor([env_tail, env_tail[::-1]], dtype=torch.long)
    ids = torch.cat([sampled, tail], dim=1)
    mask = torch.cat([torch.ones(2, 5, dtype=torch.long), torch.zeros_like(tail)], dim=1)
    return RolloutBatch(
        prompt_ids=torch.tensor([[4, 5], [4, 5]]),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=ids,
        completion_mask=torch.ones_like(ids),
        rewards=torch.tensor([1.0, 0.0]),
        group_size=2,
        max_new_tokens=HORIZON,
        temperature=1.0,
        engine_logprobs=torch.cat([-torch.rand(2, 5, generator=g), torch.zeros_like(tail, dtype=torch.float)], 1),
        loss_mask=mask,
    )


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_the_step_ignores_environment_ids_whatever_they_are_and_however_many(mode):
    """Through the module's whole pass (frozen reference, importance weights, backward)."""
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=0)
    results = []
    for tail in ([6, 7], [12, 3], [9, 9, 9, 9, 9, 9, 9]):
        module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(loss_agg=mode, beta=0.05, is_level="token"))
        rollout = rollout_with_tail(tail)
        stats = module.accumulate_gradients(rollout, module.prepare(rollout))
        grads = torch.cat([p.grad.flatten() for p in module.policy.parameters() if p.grad is not None])
        results.append((stats.loss, stats.kept_tokens, grads))
    for loss, kept, grads in results[1:]:
        assert kept == results[0][1] == 10
        assert loss == pytest.approx(results[0][0], rel=1e-5, abs=1e-7)
        torch.testing.assert_close(grads, results[0][2], rtol=1e-4, atol=1e-7)
