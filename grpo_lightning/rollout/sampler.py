"""Token sampling where every row draws from its own seeded stream (shared by HF engines)."""

from __future__ import annotations

import torch

from grpo_lightning.algorithm.truncation import Truncation, truncate_logits
from grpo_lightning.rollout.engine import Sampling


def filter_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on [B, V] logits, in float32; the filter is
    :func:`truncate_logits`, the one the trainer replays (``algorithm.truncated_sampling``)."""
    z = logits.float()
    if sampling.temperature != 1.0:
        z = z / max(sampling.temperature, 1e-6)
    return truncate_logits(z, Truncation(sampling.top_k, sampling.top_p))


def _signed(value: int) -> int:
    """A 64-bit constant as the signed int64 torch stores."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _logical_shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x >> bits`` on the unsigned 64-bit pattern of an int64 tensor."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def counter_uniforms(seeds: torch.Tensor, counter: int | torch.Tensor) -> torch.Tensor:
    """Uniforms in [0, 1), one per seed: SplitMix64 of (seed, counter), vectorized.

    A counter-based stream: draw ``counter`` of sample i depends on seed i and the counter
    only, so a batch of any size costs a handful of tensor ops (no per-row generator) and a
    sample draws the same numbers whichever samples share its batch. int64 products wrap
    modulo 2^64, which is what SplitMix64 needs. ``counter`` may be an int64 tensor [T] of
    counters: then the result is [B, T], the same numbers as T separate calls.
    """
    if isinstance(counter, torch.Tensor):
        z = seeds[:, None] + (counter[None, :] + 1) * _GOLDEN
    else:
        z = seeds + torch.full_like(seeds, counter + 1) * _GOLDEN
    z = (z ^ _logical_shift_right(z, 30)) * _MIX1
    z = (z ^ _logical_shift_right(z, 27)) * _MIX2
    z = z ^ _logical_shift_right(z, 31)
    return _logical_shift_right(z, 11).double() * (1.0 / (1 << 53))


class SeededSampler:
    """Draws the next token of row i from the stream of ``seed_i``: one stream per sample.

    Inverse-CDF sampling with one uniform per row and step (:func:`counter_uniforms`), so a
    sample's tokens depend on its own seed and logits only, not on its batch mates.
    """

    def __init__(self, seeds: list[int], sampling: Sampling):
        self.seeds = torch.tensor(seeds, dtype=torch.int64)
        self.sampling = sampling
        self.position = 0
        # Every uniform a rollout can draw, computed at once ([B, max_new_tokens], on the
        # logits' device at the first draw): one vectorized hash instead of one per token.
        self._uniforms: torch.Tensor | None = None

    def _uniform(self, device: torch.device) -> torch.Tensor:
        if self._uniforms is None:
            counters = torch.arange(max(self.sampling.max_new_tokens, 1), dtype=torch.int64)
            self._uniforms = counter_uniforms(self.seeds, counters).to(device)
        if self.position < self._uniforms.shape[1]:
            return self._uniforms[:, self.position]
        return counter_uniforms(self.seeds, self.position).to(device)

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens [B] and their log-probs [B] under the filtered distribution."""
        z = filter_logits(logits, self.sampling)
        log_probs = torch.log_softmax(z, dim=-1)
        uniforms = self._uniform(logits.device)
        self.position += 1
        cdf = log_probs.double().exp().cumsum(dim=-1)
        tokens = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:]).clamp(max=z.shape[-1] - 1)  # [B, 1]
        # A token with zero mass can only be hit through float ties at the CDF's edge.
        tokens = torch.where(torch.isfinite(z.gather(-1, tokens)), tokens, z.argmax(-1, keepdim=True))
        return tokens[:, 0], log_probs.gather(-1, tokens)[:, 0]
