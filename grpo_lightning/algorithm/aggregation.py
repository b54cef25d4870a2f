"""Loss aggregation: how per-token losses become one scalar (the F5 choice, made explicit).

Every mode is written as ``sum(numerator) / normalizer`` where the numerator is a sum over
the sequences of a micro-batch and the normalizer is a property of the WHOLE generation
batch (all micro-batches, all ranks). Because of that split, the micro-batch losses add up
to exactly the full-batch loss, so gradient accumulation is exact (F4) for every mode.

With ``l`` the per-token loss, ``m`` the completion mask, ``N`` the number of sequences in
the whole batch and ``L`` the maximum completion length:

- ``token_mean`` (DAPO): ``sum_i sum_t l*m / sum_i sum_t m``
- ``seq_mean_token_mean`` (GRPO paper): ``(1/N) sum_i [sum_t l*m / sum_t m]``
- ``seq_mean_token_sum``: ``(1/N) sum_i sum_t l*m``
- ``seq_mean_token_sum_norm`` (Dr. GRPO, as TRL's ``dr_grpo``): ``sum_i sum_t l*m / (N*L)``
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


def _check_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss aggregation mode must be one of {LOSS_AGG_MODES}, got {mode!r}")


def loss_normalizer(mask: torch.Tensor, mode: str, max_len: int | None = None) -> torch.Tensor:
    """The denominator of ``mode`` for the sequences in ``mask`` (a float scalar tensor).

    Compute it over the whole generation batch (and sum it over ranks) before the first
    backward, then pass it to :func:`aggregate` for every micro-batch.
    """
    _check_mode(mode)
    mask = mask.float()
    if mode == "token_mean":
        return mask.sum()
    num_seqs = mask.new_tensor(float(mask.shape[0]))
    if mode == "seq_mean_token_sum_norm":
        horizon = mask.shape[1] if max_len is None else max_len
        return num_seqs * horizon
    return num_seqs


def aggregate_numerator(per_token: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The part of the loss that is a plain sum over the sequences of this micro-batch."""
    _check_mode(mode)
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if mode == "seq_mean_token_mean":
        # A sequence with no tokens contributes 0 (its clamp(min=1) denominator is harmless).
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum()
    return masked.sum()


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    normalizer: torch.Tensor | float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Aggregate a [B, T] per-token loss into a scalar with ``mode``.

    Without ``normalizer`` the batch given is taken as the whole batch. With the global
    ``normalizer`` of the whole generation batch, the results over its micro-batches (and
    ranks) sum to exactly the full-batch value. A zero normalizer (no tokens) gives 0.
    """
    if normalizer is None:
        normalizer = loss_normalizer(mask, mode, max_len)
    normalizer = torch.as_tensor(normalizer, dtype=per_token.dtype, device=per_token.device)
    return aggregate_numerator(per_token, mask, mode) / normalizer.clamp(min=1e-12)
