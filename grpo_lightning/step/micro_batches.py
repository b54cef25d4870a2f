"""The micro-batches of a generation batch, and the frozen (no-gradient) passes over them.

A generation batch is sliced once into row slices of ``algorithm.micro_batch_size``, each
trimmed of the columns that are padding in all its rows; the same slices serve the
reference pass, the old-policy pass and every optimization pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from grpo_lightning.algorithm import MicroBatch
from grpo_lightning.records import RolloutBatch, TokenLogProbs


def micro_batches(rollout: RolloutBatch, size: int) -> Iterator[MicroBatch]:
    """Row slices of ``size``, each trimmed of all-padding columns; the loss reads ``trained_mask``."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attn = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
    width = rollout.prompt_ids.shape[1]
    for start in range(0, rollout.num_sequences, size):
        rows = slice(start, start + size)
        prompt_used = rollout.prompt_mask[rows].any(dim=0).nonzero()
        first = int(prompt_used[0]) if len(prompt_used) else width
        completion_used = rollout.completion_mask[rows].any(dim=0).nonzero()
        num_cols = int(completion_used[-1]) + 1 if len(completion_used) else 1
        engine = rollout.engine_logprobs
        yield MicroBatch(
            rows=rows,
            input_ids=ids[rows, first : width + num_cols],
            attention_mask=attn[rows, first : width + num_cols],
            prompt_width=width - first,
            completion_mask=rollout.trained_mask[rows, :num_cols].bool(),
            engine_logprobs=engine[rows, :num_cols] if engine is not None else None,
            vision=rollout.vision[rows] if rollout.vision is not None else None,  # whole rows: images with their text
        )


@torch.no_grad()
def frozen_log_probs(
    log_probs: Callable[..., TokenLogProbs], model: nn.Module, rollout: RolloutBatch, batches: list[MicroBatch]
) -> TokenLogProbs:
    """Log-probs of the whole batch without gradient (reference or old policy); ``log_probs`` is
    ``GRPOModule.completion_log_probs``."""
    shape = rollout.completion_ids.shape
    device = rollout.completion_ids.device
    logp = torch.zeros(shape, device=device)
    finite = torch.ones(shape, dtype=torch.bool, device=device)
    for mb in batches:
        out = log_probs(
            model,
            mb.input_ids,
            mb.attention_mask,
            mb.prompt_width,
            rollout.temperature,
            packed=lambda mb=mb: mb.packed,
            vision=mb.vision,
        )
        logp[mb.rows, : mb.num_cols] = out.logp
        finite[mb.rows, : mb.num_cols] = out.finite
    return TokenLogProbs(logp=logp, entropy=None, finite=finite)
