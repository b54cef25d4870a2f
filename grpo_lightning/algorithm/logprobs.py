"""Float32 log-probabilities of the chosen tokens, a chunk of rows at a time (F3).

A naive ``logits.float().log_softmax(-1).gather(...)`` materializes a [batch, time, vocab]
float32 tensor; on a 49k vocabulary at 32 x 256 tokens that is 1.6 GB. Here only one chunk
of rows is upcast at a time and ``log p(y) = z_y - logsumexp(z)`` is computed directly.

Non-finite logits (NaN, +-inf overflow) are replaced by zeros *before* the softmax, so no
NaN can flow backwards through them, and reported in ``finite`` so that the caller can
drop the sequence from the loss and count it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from grpo_lightning.algorithm.fused_head import fused_head_log_probs
from grpo_lightning.algorithm.truncation import Truncation, truncate_logits
from grpo_lightning.records import TokenLogProbs


def _chunk_log_probs(
    z: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = False,
    truncation: Truncation | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets``, finiteness and entropy for one chunk of [rows, V] logits;
    ``truncation`` replays the engine's top-k / top-p filter (:mod:`.truncation`)."""
    z = z.float()
    if temperature != 1.0:
        z = z / temperature
    row_ok = torch.isfinite(z).all(dim=-1)
    z = torch.where(row_ok.unsqueeze(-1), z, torch.zeros_like(z))
    if truncation is not None and truncation.active:
        z = truncate_logits(z, truncation, targets)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ok = row_ok & torch.isfinite(logp)
    logp = torch.where(ok, logp, torch.zeros_like(logp))
    if not with_entropy:  # a diagnostic: no graph is kept for it
        return logp, ok, logp.new_zeros(())
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):  # the entropy bonus needs its gradient
        probs = torch.softmax(z, dim=-1)
        entropy = lse - torch.where(probs > 0, probs * z, 0.0).sum(dim=-1)  # 0 x -inf outside a kept set
    return logp, ok, entropy


def _assemble(parts: list, batch: int, time: int, with_entropy: bool) -> TokenLogProbs:
    logp, ok, entropy = (
        (torch.cat(p) for p in zip(*parts, strict=True))
        if with_entropy
        else (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), None)
    )
    return TokenLogProbs(
        logp=logp.view(batch, time),
        entropy=entropy.view(batch, time) if entropy is not None else None,
        finite=ok.view(batch, time),
    )


def selective_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 512,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    truncation: Truncation | None = None,
) -> TokenLogProbs:
    """``log softmax(logits / temperature)[targets]`` in float32, ``chunk_size`` rows at a time.

    ``logits`` [B, T, V] in any dtype, ``targets`` [B, T] token ids. Entropy, if asked for,
    is ``logsumexp(z) - sum(softmax(z) * z)`` per position (in nats), without gradient unless
    ``entropy_grad`` (the entropy bonus, ``algorithm.entropy_coef``).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not align")
    batch, time, vocab = logits.shape
    flat_logits, flat_targets = logits.reshape(-1, vocab), targets.reshape(-1)
    parts = [
        _chunk_log_probs(
            flat_logits[i : i + chunk_size],
            flat_targets[i : i + chunk_size],
            temperature,
            with_entropy,
            entropy_grad,
            truncation,
        )
        for i in range(0, flat_logits.shape[0], chunk_size)
    ]
    return _assemble(parts, batch, time, with_entropy)


def _fusable(head: nn.Module) -> bool:
    """A plain linear head that nothing observes: the fused function calls ``F.linear`` on its
    weights directly, so forward hooks (a user's, a test's poisoning) would not run."""
    global_hooks = nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    return type(head) is nn.Linear and not (head._forward_hooks or head._forward_pre_hooks or global_hooks)


def lm_head_log_probs(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 512,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    truncation: Truncation | None = None,
    kernels: bool = True,
) -> TokenLogProbs:
    """Like :func:`selective_log_probs`, from the final hidden states [B, T, H].

    The logits of only ``chunk_size`` rows exist at any time, in the forward and in the
    backward: the [B, T, V] logits tensor is never built (on a 49k vocabulary at 32 x 256
    tokens, 1.6 GB never allocated). The head and the log-softmax are one autograd function
    (:mod:`grpo_lightning.algorithm.fused_head`) that keeps one [chunk, V] block alive at a
    time. The entropy bonus needs the entropy's gradient, and a head with forward hooks must
    be called as a module: those cases checkpoint each chunk through plain autograd instead,
    which keeps several such blocks during its backward. ``kernels``: on a GPU, the head's
    softmax as Triton kernels (``algorithm.head_kernels``).
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} do not align")
    batch, time, width = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(-1, width), targets.reshape(-1)
    replay = truncation is not None and truncation.active  # the fused head scores the full softmax only
    if not (entropy_grad and with_entropy) and not replay and _fusable(lm_head):
        fused = fused_head_log_probs(
            flat_hidden, lm_head, flat_targets, temperature, chunk_size, with_entropy, kernels=kernels
        )
        return _assemble([fused], batch, time, with_entropy)

    def chunk(h: torch.Tensor, t: torch.Tensor):
        return _chunk_log_probs(lm_head(h), t, temperature, with_entropy, entropy_grad, truncation)

    # One chunk's logits are within the budget anyway: recomputing them would only cost time.
    recompute = (
        flat_hidden.shape[0] > chunk_size
        and torch.is_grad_enabled()
        and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    )
    parts = []
    for i in range(0, flat_hidden.shape[0], chunk_size):
        h, t = flat_hidden[i : i + chunk_size], flat_targets[i : i + chunk_size]
        parts.append(checkpoint(chunk, h, t, use_reentrant=False) if recompute else chunk(h, t))
    return _assemble(parts, batch, time, with_entropy)
