"""Top-p / top-k sampling: the trainer's full-softmax log-probs are off by log(kept mass); replaying
the engine's kept set removes the gap exactly (synthetic logits, our own seeded sampler)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_lightning.algorithm.logprobs import selective_log_probs
from grpo_lightning.algorithm.truncation import Truncation, kept_set, replayed_truncation
from grpo_lightning.rollout.engine import Sampling
from grpo_lightning.rollout.sampler import SeededSampler


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), [(0, 0.9, 1.0), (5, 1.0, 0.7), (8, 0.8, 1.3)])
def test_gap_is_log_kept_mass_without_replay_and_zero_with_it(top_k, top_p, temperature):
    g = torch.Generator().manual_seed(top_k)
    steps, vocab = 64, 40
    logits = torch.randn(steps, vocab, generator=g) * 3
    sampler = SeededSampler(list(range(steps)), Sampling(steps, temperature, top_p, top_k))
    tokens, engine_logp = sampler.draw(logits)  # each row one position of a sequence
    full = selective_log_probs(logits[None], tokens[None], temperature).logp[0]
    replay = selective_log_probs(logits[None], tokens[None], temperature, truncation=Truncation(top_k, top_p)).logp[0]
    z = logits / temperature
    kept_mass = (torch.softmax(z, -1) * kept_set(z, Truncation(top_k, top_p))).sum(-1)
    delta_full, delta_replay = full - engine_logp, replay - engine_logp
    assert float(delta_full.mean()) == pytest.approx(float(kept_mass.log().mean()), abs=1e-5)
    assert float(delta_full.mean()) < -1e-3  # the filter did cut mass
    assert float(delta_replay.abs().max()) < 1e-5


def test_replay_keeps_the_sampled_token_and_its_gradient_is_the_truncated_softmax():
    logits = torch.tensor([[[4.0, 3.0, 0.0, -1.0]]], requires_grad=True)
    target = torch.tensor([[2]])  # outside top-2: replay keeps it rather than dropping the sequence
    out = selective_log_probs(logits, target, truncation=Truncation(top_k=2))
    assert bool(out.finite.all())
    out.logp.sum().backward()
    kept = torch.tensor([4.0, 3.0, 0.0])
    want = -torch.softmax(kept, -1)
    want[2] += 1
    torch.testing.assert_close(logits.grad[0, 0, :3], want)
    assert float(logits.grad[0, 0, 3]) == 0.0


def test_the_module_replays_only_when_a_filter_is_on_and_replay_is_chosen():
    gen = SimpleNamespace(sampling=Sampling(8, 1.0, 0.9, 0))
    assert replayed_truncation(gen, SimpleNamespace(truncated_sampling="replay")) == Truncation(0, 0.9)
    assert replayed_truncation(SimpleNamespace(sampling=Sampling(8, 1.0, 1.0, 0)), SimpleNamespace()) is None
    assert replayed_truncation(None, SimpleNamespace()) is None
