"""Padding-free passes (algorithm.pack_sequences): same log-probs, same gradients, fewer positions.

The property tests draw random micro-batches (prompt and completion lengths, left and right
padding, batch sizes) and compare the packed forward with the padded one on the tiny Llama.
"""

from __future__ import annotations

import copy
import random
from dataclasses import fields, replace
from itertools import pairwise

import pytest
import torch
from conftest import gradients

import grpo_lightning.algorithm.objective as objective
from grpo_lightning.algorithm import packing
from grpo_lightning.algorithm.packing import first_fit_decreasing, pack_micro_batch
from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.models.forward import CompletionLogProbs
from grpo_lightning.step.micro_batches import micro_batches
from grpo_lightning.step.module import GRPOModule

CASES = 60


def random_micro_batch(rng: random.Random, vocab: int):
    """[b, P + C] ids and mask: left-padded prompts (>= 1 token), right-padded completions (>= 0 tokens, >= 1 in the first row)."""
    b, width, cols = rng.randint(1, 9), rng.randint(1, 10), rng.randint(1, 12)
    ids = torch.tensor([[rng.randrange(3, vocab) for _ in range(width + cols)] for _ in range(b)])
    mask = torch.zeros(b, width + cols, dtype=torch.long)
    for i in range(b):
        prompt_len, completion_len = rng.randint(1, width), rng.randint(0 if i else 1, cols)
        mask[i, width - prompt_len : width + completion_len] = 1
    return ids, mask, width


def test_first_fit_decreasing_places_every_sequence_within_capacity_without_overlap():
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 40))]
        capacity = max(lengths)
        placement = first_fit_decreasing(lengths, capacity)
        spans: dict[int, list[tuple[int, int]]] = {}
        for (row, offset), length in zip(placement, lengths, strict=True):
            assert offset + length <= capacity
            spans.setdefault(row, []).append((offset, offset + length))
        for row_spans in spans.values():
            row_spans.sort()
            assert all(a[1] <= b[0] for a, b in pairwise(row_spans))
        assert sorted(spans) == list(range(len(spans)))  # rows are numbered densely
        # first-fit decreasing never needs more rows than the sequences' total over capacity, x2 (+1)
        assert len(spans) <= 2 * sum(lengths) / capacity + 1


def test_packing_keeps_every_real_token_once_with_restarting_positions():
    rng = random.Random(1)
    for _ in range(CASES):
        ids, mask, width = random_micro_batch(rng, 20)
        packed = pack_micro_batch(ids, mask, width)
        assert packed.num_real_tokens == int(mask.sum())
        assert packed.input_ids.shape[1] == int(mask.sum(dim=1).max())
        assert packed.input_ids.shape[0] <= ids.shape[0]  # never more positions than padded
        lengths = sorted(mask.sum(dim=1).tolist())
        if len(lengths) > 1 and lengths[0] + lengths[1] <= lengths[-1]:  # two fit in one row
            assert packed.input_ids.shape[0] < ids.shape[0]
        # every completion token is predicted from the packed position just before it
        flat = packed.input_ids.reshape(-1)
        assert torch.equal(flat[packed.source + 1], packed.targets)
        assert torch.equal(packed.completion_valid, mask[:, width:].bool())
        # the real tokens' positions are 0..L-1 per sequence: as many zeros as sequences plus free slots
        free = packed.input_ids.numel() - packed.num_real_tokens
        assert int((packed.position_ids == 0).sum()) == ids.shape[0] + free


def test_packed_log_probs_equal_padded_on_random_micro_batches(policy):
    forward = CompletionLogProbs(chunk_mb=0.01, pack=True)  # tiny chunks: several per micro-batch
    rng = random.Random(2)
    vocab = policy.get_input_embeddings().num_embeddings
    policy.eval()
    worst = 0.0
    with torch.no_grad():
        for _ in range(CASES):
            ids, mask, width = random_micro_batch(rng, vocab)
            want = forward.padded(policy, ids, mask, width, 0.7, with_entropy=True)
            got = forward.packed(policy, pack_micro_batch(ids, mask, width), 0.7, with_entropy=True)
            valid = mask[:, width:].bool()
            worst = max([worst, *(got.logp - want.logp)[valid].abs().tolist()])
            torch.testing.assert_close(got.entropy[valid], want.entropy[valid], atol=1e-5, rtol=1e-5)
            assert bool(got.finite.all())
            assert bool((got.logp[~valid] == 0).all())
    assert worst < 1e-5, f"packed and padded log-probs differ by {worst}"


def test_packed_gradients_equal_padded_gradients(policy, rollout):
    """The whole objective, KL and two iterations included: packing changes no gradient."""
    for config in ({}, {"beta": 0.1, "num_iterations": 2, "micro_batch_size": 4}, {"entropy_coef": 0.01}):
        padded, padded_stats = gradients(policy, rollout, pack_sequences=False, **config)
        packed, packed_stats = gradients(policy, rollout, pack_sequences=True, **config)
        assert padded.keys() == packed.keys()
        for name in padded:
            torch.testing.assert_close(packed[name], padded[name], atol=1e-6, rtol=1e-4, msg=name)
        assert packed_stats.kept_tokens == padded_stats.kept_tokens
        assert abs(packed_stats.loss - padded_stats.loss) < 1e-6


class _IgnoresPackedPositions(torch.nn.Module):
    """A decoder that drops ``position_ids`` and so builds a plain causal mask over a packed row."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, **inputs):
        inputs.pop("position_ids")
        return self.decoder(**inputs)


def test_probe_falls_back_to_padding_for_a_model_whose_attention_crosses_sequences(policy, rollout):
    broken = copy.deepcopy(policy).eval()
    decoder = _IgnoresPackedPositions(broken.model)
    broken.get_decoder = lambda: decoder
    forward = CompletionLogProbs(chunk_mb=96, pack=True)
    module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(micro_batch_size=16))
    mb = module.prepare(rollout).micro_batches[0]
    with pytest.warns(
        UserWarning, match=r"algorithm.pack_sequences: packed and padded log-probs of LlamaForCausalLM differ"
    ):
        out = forward(broken, mb.input_ids, mb.attention_mask, mb.prompt_width, 1.0)
    assert forward.packing_verified is False
    with torch.no_grad():
        want = forward.padded(broken, mb.input_ids, mb.attention_mask, mb.prompt_width, 1.0)
    assert torch.equal(out.logp, want.logp)  # it ran padded


def test_probe_passes_for_transformers_llama_and_training_runs_packed(policy, rollout):
    module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(micro_batch_size=16, pack_sequences=True))
    module.accumulate_gradients(rollout, module.prepare(rollout))
    assert module.forward_pass.packing_verified is True
    assert module.forward_pass.last_padding_share is not None


def test_each_micro_batch_is_packed_once_for_all_its_passes(policy, rollout, monkeypatch):
    """The checkpointing choice, the reference pass and the policy pass share one packing."""
    calls = []
    real = packing.pack_micro_batch
    monkeypatch.setattr(packing, "pack_micro_batch", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(objective, "pack_micro_batch", packing.pack_micro_batch)
    module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(beta=0.04, micro_batch_size=6), auto_checkpointing=True)
    module.forward_pass.packing_verified = True  # the probe packs its own rows
    prepared = module.prepare(rollout)
    module._choose_checkpointing(prepared)
    stats = module.accumulate_gradients(rollout, prepared)
    assert stats.finite_loss
    assert len(prepared.micro_batches) == 3 and len(calls) == 3


def _repeated(rollout, times: int):
    """The rollout's rows ``times`` over (every per-row tensor repeated along the batch)."""
    rows = rollout.num_sequences
    repeated = {
        f.name: value.repeat(times, *([1] * (value.dim() - 1)))
        for f in fields(rollout)
        if isinstance(value := getattr(rollout, f.name), torch.Tensor) and value.dim() > 0 and value.shape[0] == rows
    }
    repeated["reward_components"] = {k: v.repeat(times) for k, v in rollout.reward_components.items()}
    return replace(rollout, **repeated)


def test_auto_micro_batches_hold_every_short_sequence_of_the_rollout_at_once(policy, rollout):
    """auto decides from the rollout's used width: 96 short rows are one pass, not three of 32."""
    big = _repeated(rollout, 6)
    (whole,) = micro_batches(big, big.num_sequences)
    assert big.used_width == whole.input_ids.shape[1]  # the trimmed width of a micro-batch of every row
    assert big.num_sequences == 96 and big.used_width * 96 <= 4096
    module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(beta=0.04))
    module.forward_pass.packing_verified = True
    prepared = module.prepare(big)
    assert [mb.input_ids.shape[0] for mb in prepared.micro_batches] == [96]
    assert AlgorithmConfig().micro_batch(96) == 32  # what auto chose before it read the width
