"""Token sampling where every row draws from its own seeded stream (shared by HF engines)."""

from __future__ import annotations

import torch

from grpo_lightning.rollout.engine import SamplingSettings


def filter_logits(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on [B, V] logits, in float32."""
    z = logits.float() / max(sampling.temperature, 1e-6)
    vocab = z.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(z, sampling.top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_z, dim=-1).cumsum(dim=-1)
        # Drop a token once the mass before it already reaches top_p (the top token stays).
        drop_sorted = (cumulative - torch.softmax(sorted_z, dim=-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


class SeededSampler:
    """Draws the next token of row i from ``torch.Generator(seed_i)``: one stream per sample.

    Inverse-CDF sampling with one uniform per row and step, so a sample's tokens depend on
    its own seed and logits only, not on which other samples share the batch.
    """

    def __init__(self, seeds: list[int], sampling: SamplingSettings):
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.sampling = sampling

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens [B] and their log-probs [B] under the filtered distribution."""
        z = filter_logits(logits, self.sampling)
        log_probs = torch.log_softmax(z, dim=-1)
        uniforms = torch.stack([torch.rand((), generator=g) for g in self.generators])
        cdf = log_probs.exp().cumsum(dim=-1)
        uniforms = uniforms.to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, uniforms).squeeze(-1).clamp(max=z.shape[-1] - 1)
        # A token with zero mass can only be hit through float ties at the CDF's edge.
        tokens = torch.where(torch.isfinite(z.gather(-1, tokens[:, None]).squeeze(-1)), tokens, z.argmax(-1))
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
