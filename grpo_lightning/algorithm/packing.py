"""Padding-free training passes: the sequences of a micro-batch packed into rows.

A micro-batch arrives as [b, T] rows, prompts left-padded and completions right-padded;
on a reasoning-gym batch with 128 new tokens a third or more of those positions is
padding, and every one of them costs a full forward and backward through the decoder.
:func:`pack_micro_batch` moves the real tokens of each sequence into as few rows as fit
(first-fit decreasing, rows as long as the longest sequence) with position ids restarting
at 0 for every sequence. Given ``position_ids`` and no ``attention_mask``, transformers
builds a block-diagonal causal mask from the restarts (``masking_utils.find_packed_sequence_indices``
for sdpa and eager on CPU and GPU, variable-length kernels for flash attention), so no
token attends across sequences and each sequence sees exactly what it saw padded.

Free positions at the end of a row get position 0 each: every one is a sequence of one
token that nothing attends to. The hidden state that predicts completion token ``j`` of a
sequence sits one packed position before that token (``source``); log-probs are taken
there and scattered back to the [b, C] completion layout the loss works in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lightning.records.varlen import VarLen


@dataclass(frozen=True)
class PackedMicroBatch:
    """A micro-batch's real tokens in packed rows, and where each completion token went."""

    input_ids: torch.Tensor  # [R, W] packed token ids
    position_ids: torch.Tensor  # [R, W] restarting at 0 per sequence (0 on free positions)
    source: torch.Tensor  # [n] flat index into [R * W] of the position predicting each completion token
    targets: torch.Tensor  # [n] the completion tokens, in [b, C] row-major order
    completion_valid: torch.Tensor  # [b, C] bool: positions of the completion layout that are real tokens
    num_real_tokens: int  # tokens of the micro-batch (prompt and completion)
    # [T] flat index into [R * W] of every real token, sequence after sequence: where per-token inputs other
    # than the ids (a VLM's input embeddings and 3-D positions) go when packed
    dest: torch.Tensor | None = None

    @property
    def padding_share(self) -> float:
        """Share of the packed positions that hold no token."""
        return 1.0 - self.num_real_tokens / max(1, self.input_ids.numel())


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[tuple[int, int]]:
    """(row, offset) for each length: longest first, each into the first row it fits."""
    fill: list[int] = []
    placement: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for row, used in enumerate(fill):
            if used + lengths[i] <= capacity:
                placement[i] = (row, used)
                fill[row] += lengths[i]
                break
        else:
            placement[i] = (len(fill), 0)
            fill.append(lengths[i])
    return placement


def pack_micro_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> PackedMicroBatch:
    """Pack the rows of ``input_ids`` [b, T] (real tokens where ``attention_mask``) into rows
    as long as the longest sequence; completions start at column ``prompt_width``.

    Every sequence needs at least one real prompt token (the position that predicts its
    first completion token).
    """
    mask = attention_mask.bool()
    if bool((mask[:, :prompt_width].sum(dim=1) == 0).any()):
        raise ValueError("pack_micro_batch: a sequence has no prompt token to predict its first completion token from")
    return pack_layout(VarLen.from_padded(input_ids, mask), mask[:, prompt_width:])


def pack_layout(tokens: VarLen, completion_valid: torch.Tensor) -> PackedMicroBatch:
    """Pack variable-length sequences (``tokens``: prompt then completion, no padding) into rows
    as long as the longest one. ``completion_valid`` [b, C] marks the columns of the padded
    completion layout that hold each sequence's completion tokens, its last ones in order."""
    lengths = tokens.lengths
    completion_lengths = completion_valid.sum(dim=1)
    if bool((lengths - completion_lengths < 1).any()):
        raise ValueError("pack_layout: a sequence has no prompt token to predict its first completion token from")
    capacity = int(lengths.max())
    placement = first_fit_decreasing(lengths.tolist(), capacity)
    num_rows = max(row for row, _ in placement) + 1
    device = tokens.values.device

    # Destination (flat packed index) of every token, in the order of the layout.
    starts = torch.tensor([row * capacity + offset for row, offset in placement], device=device)
    within = tokens.positions()  # position of each token in its sequence
    seq_of_token = tokens.sequence_index()
    dest = starts[seq_of_token] + within

    packed_ids = torch.zeros(num_rows * capacity, dtype=tokens.values.dtype, device=device)
    packed_pos = torch.zeros(num_rows * capacity, dtype=torch.long, device=device)
    packed_ids[dest] = tokens.values
    packed_pos[dest] = within

    is_completion = within >= (lengths - completion_lengths)[seq_of_token]
    return PackedMicroBatch(
        input_ids=packed_ids.view(num_rows, capacity),
        position_ids=packed_pos.view(num_rows, capacity),
        source=dest[is_completion] - 1,
        targets=tokens.values[is_completion],
        completion_valid=completion_valid,
        num_real_tokens=int(lengths.sum()),
        dest=dest,
    )


def scatter_completion(values: torch.Tensor, valid: torch.Tensor, fill: float | bool) -> torch.Tensor:
    """Values [n] of the real completion tokens back into the [b, C] layout (``fill`` elsewhere)."""
    out = torch.full(valid.shape, fill, dtype=values.dtype, device=values.device)
    return out.masked_scatter(valid, values)
