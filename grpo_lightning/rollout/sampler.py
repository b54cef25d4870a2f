"""Token sampling where every row draws from its own seeded stream (shared by HF engines)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import grpo_lightning.rollout.cdf_kernel as cdf_kernel
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

    def uniform_table(self, device: torch.device) -> torch.Tensor:
        """Every uniform the rollout's ``max_new_tokens`` draws use, [B, max_new_tokens] on ``device``:
        column t is draw t's (a recorded decode step reads its column by a device counter)."""
        if self._uniforms is None:
            counters = torch.arange(max(self.sampling.max_new_tokens, 1), dtype=torch.int64)
            self._uniforms = counter_uniforms(self.seeds, counters).to(device)
        return self._uniforms

    def _uniform(self, device: torch.device) -> torch.Tensor:
        table = self.uniform_table(device)
        if self.position < table.shape[1]:
            return table[:, self.position]
        return counter_uniforms(self.seeds, self.position).to(device)

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next tokens [B] and their log-probs [B] under the filtered distribution."""
        uniforms = self._uniform(logits.device)
        self.position += 1
        return draw_tokens(logits, self.sampling, uniforms)


# The inverse CDF goes in two levels: the cumulative sum of blocks of this many tokens' masses,
# then the cumulative sum inside the one block the uniform falls in. A cumulative sum along a
# whole vocabulary runs on a GPU as a few thread blocks (one per 16 rows) walking 152k entries.
CDF_BLOCK = 1024


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[B, 1]: for each row of float64 masses ``probs`` [B, V], the first token whose cumulative
    mass reaches ``uniforms`` [B] times the row's total (the searchsorted of a full cumulative
    sum, summed block by block)."""
    rows, vocab = probs.shape
    if vocab <= CDF_BLOCK:  # one block: the plain cumulative sum
        cdf = probs.cumsum(dim=-1)
        return torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:]).clamp(max=vocab - 1)
    blocks = -(-vocab // CDF_BLOCK)
    padded = F.pad(probs, (0, blocks * CDF_BLOCK - vocab)).view(rows, blocks, CDF_BLOCK)
    block_cdf = padded.sum(dim=-1).cumsum(dim=-1)  # [B, blocks]
    target = uniforms[:, None] * block_cdf[:, -1:]  # [B, 1]
    block = torch.searchsorted(block_cdf, target).clamp(max=blocks - 1)
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)
    inside = padded.gather(1, block[:, :, None].expand(rows, 1, CDF_BLOCK))[:, 0].cumsum(dim=-1)  # [B, CDF_BLOCK]
    offset = torch.searchsorted(inside, target - before).clamp(max=CDF_BLOCK - 1)
    return (block * CDF_BLOCK + offset).clamp(max=vocab - 1)


def draw_tokens(logits: torch.Tensor, sampling: Sampling, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [B] drawn by inverse CDF with ``uniforms`` [B] from the filtered ``logits`` [B, V], and
    their log-probs [B]. No host-side state and no value read back: a CUDA graph can record it."""
    z = filter_logits(logits, sampling)
    log_probs = torch.log_softmax(z, dim=-1)
    tokens = _inverse_cdf(log_probs, uniforms)  # [B, 1]
    # A token with zero mass can only be hit through float ties at the CDF's edge.
    tokens = torch.where(torch.isfinite(z.gather(-1, tokens)), tokens, z.argmax(-1, keepdim=True))
    return tokens[:, 0], log_probs.gather(-1, tokens)[:, 0]


def _inverse_cdf(log_probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`inverse_cdf` of the masses ``exp(log_probs)``: on a GPU through the Triton kernel of
    :mod:`cdf_kernel` once its first eager draw picked the eager path's tokens (a draw recorded into
    a CUDA graph before that check takes the eager path: the check reads its result on the host)."""
    verdict = cdf_kernel.checked(log_probs.device) if cdf_kernel.usable(log_probs) else False
    if verdict:
        return cdf_kernel.inverse_cdf_from_log_probs(log_probs, uniforms)
    tokens = inverse_cdf(log_probs.double().exp(), uniforms)
    if verdict is None and not _capturing():
        cdf_kernel.kernel_agrees(log_probs, uniforms, tokens)
    return tokens


def _capturing() -> bool:
    """A CUDA graph is being recorded on the current stream (False on a build without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
