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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpo_lightning.registry import Registry


@dataclass(frozen=True)
class AggregationMode:
    """A registered aggregation: its batch normalizer and its per-micro-batch numerator."""

    normalizer: Callable[[torch.Tensor, int], torch.Tensor]  # (float mask [B, T], horizon L) -> scalar
    numerator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (masked loss, mask) -> scalar


LOSS_AGG_MODES: Registry[AggregationMode] = Registry("loss aggregation mode", "algorithm.loss_agg")


def _token_sum(masked: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked.sum()


def _sequence_means(masked: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # A sequence with no tokens contributes 0 (its clamp(min=1) denominator is harmless).
    return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum()


def _num_seqs(mask: torch.Tensor, horizon: int) -> torch.Tensor:
    return mask.new_tensor(float(mask.shape[0]))


LOSS_AGG_MODES.add("token_mean", AggregationMode(lambda mask, horizon: mask.sum(), _token_sum))
LOSS_AGG_MODES.add("seq_mean_token_mean", AggregationMode(_num_seqs, _sequence_means))
LOSS_AGG_MODES.add("seq_mean_token_sum", AggregationMode(_num_seqs, _token_sum))
LOSS_AGG_MODES.add(
    "seq_mean_token_sum_norm", AggregationMode(lambda mask, horizon: _num_seqs(mask, horizon) * horizon, _token_sum)
)


def loss_normalizer(mask: torch.Tensor, mode: str, max_len: int | None = None) -> torch.Tensor:
    """The denominator of ``mode`` for the sequences in ``mask`` (a float scalar tensor).

    Compute it over the whole generation batch (and sum it over ranks) before the first
    backward, then pass it to :func:`aggregate` for every micro-batch.
    """
    return LOSS_AGG_MODES[mode].normalizer(mask.float(), mask.shape[1] if max_len is None else max_len)


def aggregate_numerator(per_token: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The part of the loss that is a plain sum over the sequences of this micro-batch."""
    agg = LOSS_AGG_MODES[mode]
    mask = mask.to(per_token.dtype)
    return agg.numerator(per_token * mask, mask)


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
