"""Float32 log-probabilities of the chosen tokens, a chunk of rows at a time (F3).

A naive ``logits.float().log_softmax(-1).gather(...)`` materializes a [batch, time, vocab]
float32 tensor; on a 49k vocabulary at 32 x 256 tokens that is 1.6 GB. Here only one chunk
of rows is upcast at a time and ``log p(y) = z_y - logsumexp(z)`` is computed directly.

Non-finite logits (NaN, +-inf overflow) are replaced by zeros *before* the softmax, so no
NaN can flow backwards through them, and reported in ``finite`` so that the caller can
drop the sequence from the loss and count it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class TokenLogProbs(NamedTuple):
    logp: torch.Tensor  # [B, T] float32, 0 where not finite
    entropy: torch.Tensor | None  # [B, T] float32 or None
    finite: torch.Tensor  # [B, T] bool: the logits row and the log-prob were finite


def selective_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 4096,
    with_entropy: bool = False,
) -> TokenLogProbs:
    """``log softmax(logits / temperature)[targets]`` in float32, ``chunk_size`` rows at a time.

    ``logits`` [B, T, V] in any dtype, ``targets`` [B, T] token ids. Entropy, if asked for,
    is ``logsumexp(z) - sum(softmax(z) * z)`` per position (in nats), without gradient.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not align"
        )
    batch, time, vocab = logits.shape
    flat_logits = logits.reshape(-1, vocab)
    flat_targets = targets.reshape(-1)
    logps, entropies, finites = [], [], []
    for start in range(0, flat_logits.shape[0], chunk_size):
        z = flat_logits[start : start + chunk_size].float()
        if temperature != 1.0:
            z = z / temperature
        row_ok = torch.isfinite(z).all(dim=-1)
        z = torch.where(row_ok.unsqueeze(-1), z, torch.zeros_like(z))
        lse = torch.logsumexp(z, dim=-1)
        chosen = z.gather(-1, flat_targets[start : start + chunk_size].unsqueeze(-1)).squeeze(-1)
        logp = chosen - lse
        ok = row_ok & torch.isfinite(logp)
        logps.append(torch.where(ok, logp, torch.zeros_like(logp)))
        finites.append(ok)
        if with_entropy:  # a diagnostic: no graph is kept for it
            with torch.no_grad():
                probs = torch.softmax(z, dim=-1)
                entropies.append(lse - (probs * z).sum(dim=-1))
    logp = torch.cat(logps).view(batch, time)
    finite = torch.cat(finites).view(batch, time)
    entropy = torch.cat(entropies).view(batch, time) if with_entropy else None
    return TokenLogProbs(logp=logp, entropy=entropy, finite=finite)
