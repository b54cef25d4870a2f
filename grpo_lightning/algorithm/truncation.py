"""The engine's top-k / top-p filter, shared by our samplers and replayed in the trainer's log-probs.

With ``rollout.top_p < 1`` or ``rollout.top_k > 0`` the engine samples from a truncated
distribution ``q(y) = p(y) 1[y in K] / p(K)`` (``K`` the kept set) while a trainer scoring the
full softmax computes ``log p(y)``: every sampled token then carries a gap of ``log p(K)``, the
log of the kept mass (TRL #6789), and any importance weight built on it is biased. Replaying the
filter on the trainer's own logits gives ``log q(y)`` instead (``algorithm.truncated_sampling``).

The sampled token always stays in the replayed set: where the trainer's logits put it just
outside (float noise at the boundary) its log-prob stays finite rather than dropping the sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

TRUNCATED_SAMPLING = ("replay", "refuse")


class Truncation(NamedTuple):
    """The sampling filter applied after the temperature: top-k first, then top-p."""

    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


def kept_set(z: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """[..., V] bool: the tokens the filter keeps for tempered logits ``z`` (vLLM's and HF's rule:
    top-k by value, then drop a token once the mass before it in the sorted order reaches top_p)."""
    keep = torch.ones_like(z, dtype=torch.bool)
    vocab = z.shape[-1]
    if 0 < truncation.top_k < vocab:
        kth = torch.topk(z, truncation.top_k, dim=-1).values[..., -1:]
        keep = z >= kth
    if truncation.top_p < 1.0:
        sorted_z, order = torch.sort(z.masked_fill(~keep, float("-inf")), dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= truncation.top_p  # the top token always stays
        keep = keep & ~torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return keep


def truncate_logits(z: torch.Tensor, truncation: Truncation, targets: torch.Tensor | None = None) -> torch.Tensor:
    """``z`` with the tokens outside the kept set at -inf; ``targets`` [...] (the sampled tokens) are kept."""
    if not truncation.active:
        return z
    keep = kept_set(z.detach(), truncation)
    if targets is not None:
        keep = keep.scatter(-1, targets.unsqueeze(-1), True)
    return z.masked_fill(~keep, float("-inf"))


def replayed_truncation(generator: object, cfg: object) -> Truncation | None:
    """The filter the trainer replays: the generator's ``sampling`` top-k / top-p when
    ``algorithm.truncated_sampling=replay`` and a filter is on, else None (full softmax)."""
    sampling = getattr(generator, "sampling", None)
    if sampling is None or getattr(cfg, "truncated_sampling", "replay") != "replay":
        return None
    truncation = Truncation(int(sampling.top_k), float(sampling.top_p))
    return truncation if truncation.active else None
