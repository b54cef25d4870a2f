"""``SlotDecoder``: the fused decoder's layers over a fixed set of rows that sequences join and leave.

The pipeline's HF engine keeps the decode batch full: a sequence that ends frees its row, and the
next one is prefilled into it while the others go on (continuous batching). Every row writes its
own cache column (:class:`~grpo_lightning.rollout.fused_decode.RowSlots`) and reads the whole cache
with a per-row mask, so rows need not be aligned; a row's rotary positions count its own tokens
from 0, as the loop's forward does. The prefill of the sequences that join is the fused decoder's
own (:class:`FusedDecoder.prefill`), so a sequence's first logits are the sync engine's. The
weights are the :class:`FusedWeights` the decoder was given: refreshed in place, they take effect
at the next step, and the keys and values already cached stay those of the older weights
(the partial rollouts of PipelineRL and prime-rl: no recomputation).
"""

from __future__ import annotations

import torch

from grpo_lightning.rollout.fused_decode import FusedDecoder, FusedWeights, RowSlots


class SlotDecoder(FusedDecoder):
    """``rows`` sequences at most, each with ``width`` cache columns (prompt plus completion)."""

    def __init__(self, weights: FusedWeights, rows: int, width: int):
        self.weights = weights
        reference = weights.embedding
        self.rows, self.width = rows, width
        shape = (rows, weights.kv_heads, width, weights.head_dim)
        self.keys = [reference.new_zeros(shape) for _ in weights.layers]
        self.values = [reference.new_zeros(shape) for _ in weights.layers]
        self.scaling = weights.head_dim**-0.5
        self.mask = reference.new_full((rows, width), float("-inf"))  # 0 on the columns each row attends to
        self.mask[:, 0] = 0.0  # an empty row attends to one column: no softmax over nothing
        self.column = torch.zeros(rows, dtype=torch.long, device=reference.device)  # each row's next write
        self.position = torch.zeros(rows, dtype=torch.long, device=reference.device)  # its next rotary position
        self._all_rows = torch.arange(rows, device=reference.device)
        self._heads = torch.arange(weights.kv_heads, device=reference.device)
        positions = torch.arange(width, device=reference.device)[None]
        self._rotations = self._rotation(weights.rotary(torch.empty(0, device=reference.device), positions))[0]

    def join(self, rows: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """Prefill left-padded prompts [J, P] into ``rows`` [J]; returns their next logits [J, V]."""
        width = prompt_ids.shape[1]
        if width >= self.width:
            raise ValueError(f"a prompt of {width} tokens does not fit the decoder's {self.width} columns")
        prefill = FusedDecoder(None, prompt_mask, 0, self.weights)
        logits = prefill.prefill(prompt_ids)
        for cache, filled in zip([*self.keys, *self.values], [*prefill.keys, *prefill.values], strict=True):
            cache[rows, :, :width] = filled
        self.mask[rows] = float("-inf")
        self.mask[rows, :width] = torch.where(prompt_mask.bool(), 0.0, float("-inf"))
        self.column[rows] = width
        self.position[rows] = prompt_mask.sum(dim=1)
        return logits

    def widen(self, width: int) -> None:
        """Room for ``width`` positions a row, the sequences in flight kept (their cache copied over)."""
        extra = width - self.width
        if extra <= 0:
            return
        pad = torch.nn.functional.pad
        self.keys = [pad(cache, (0, 0, 0, extra)) for cache in self.keys]
        self.values = [pad(cache, (0, 0, 0, extra)) for cache in self.values]
        self.mask = pad(self.mask, (0, extra), value=float("-inf"))
        positions = torch.arange(width, device=self.mask.device)[None]
        self._rotations = self._rotation(self.weights.rotary(torch.empty(0, device=self.mask.device), positions))[0]
        self.width = width

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """The next logits [n, V] of the first ``n`` rows after ``tokens`` [n] (rows past the last occupied
        one are not computed); only ``active`` [n] bool rows advance (the others compute over their own
        column 0, harmlessly, and are ignored)."""
        n = tokens.shape[0]
        rows = self._all_rows[:n]
        columns = torch.where(active, self.column[:n], 0)
        self.mask[rows, columns] = torch.where(active, 0.0, self.mask[rows, columns])
        rotation = self._rotations[torch.where(active, self.position[:n], 0)][:, None]  # [n, 1, 1, D / 2]
        end = int(columns.max()) + 1  # no row attends past its last write: the rest of the width is skipped
        bias = self.mask[:n, :end].repeat_interleave(self.weights.kv_heads, dim=0)[:, None]  # [n x kv_heads, 1, end]
        hidden = torch.nn.functional.embedding(tokens, self.weights.embedding)[:, None]
        kv_heads, width = self.weights.kv_heads, self.width
        # each (row, kv head)'s write as one index into the cache viewed as [n x kv_heads x width, head_dim]
        flat = ((rows[:, None] * kv_heads + self._heads[None]) * width + columns[:, None]).reshape(-1)
        slots = RowSlots(rows, columns, flat, end)
        caches = self.keys, self.values
        self.keys, self.values = [k[:n] for k in caches[0]], [v[:n] for v in caches[1]]  # views: writes land
        try:
            for index in range(len(self.weights.layers)):
                hidden = self._layer(index, hidden, rotation, slots, bias)
        finally:
            self.keys, self.values = caches
        self.column[:n] += active.long()
        self.position[:n] += active.long()
        return self._logits(hidden[:, 0])
