"""``VarLen``: sequences of different lengths in one flat tensor, addressed by offsets.

The padded [N, W] layout wastes the positions past each sequence's end, and multi-turn
episodes differ in length by far more than single completions do. A :class:`VarLen` keeps
only the real tokens, sequence after sequence (``values[offsets[i]:offsets[i + 1]]`` is
sequence ``i``), the ``cu_seqlens`` convention of variable-length attention kernels; the
per-token fields of a batch (ids, loss mask, engine log-probs, weight versions, turn ids)
share one set of offsets, and packing places the flat tokens without re-deriving them.
This module imports only torch: it is the lowest layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VarLen:
    """``values`` [T, ...] of N sequences; sequence ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: torch.Tensor  # [T, ...]
    offsets: torch.Tensor  # [N + 1] long: 0, then the cumulative lengths

    def __post_init__(self) -> None:
        if self.offsets.dim() != 1 or len(self.offsets) == 0 or int(self.offsets[0]) != 0:
            raise ValueError("VarLen.offsets must be a 1-d tensor starting at 0")
        if bool((self.offsets.diff() < 0).any()):
            raise ValueError("VarLen.offsets must not decrease")
        if int(self.offsets[-1]) != self.values.shape[0]:
            raise ValueError(
                f"VarLen.offsets end at {int(self.offsets[-1])} but there are {self.values.shape[0]} values"
            )

    # ----------------------------------------------------------------------- building
    @classmethod
    def from_lengths(cls, values: torch.Tensor, lengths: torch.Tensor | list[int]) -> VarLen:
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=values.device)
        return cls(values, torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]))

    @classmethod
    def from_lists(cls, rows: list[list], dtype: torch.dtype = torch.long) -> VarLen:
        flat = [value for row in rows for value in row]
        return cls.from_lengths(torch.tensor(flat, dtype=dtype), [len(row) for row in rows])

    @classmethod
    def from_padded(cls, padded: torch.Tensor, mask: torch.Tensor) -> VarLen:
        """The positions of ``padded`` [N, W, ...] where ``mask`` [N, W], row after row in column
        order: padding on either side (or between) is dropped."""
        mask = mask.bool()
        return cls.from_lengths(padded[mask], mask.sum(dim=1))

    # ----------------------------------------------------------------------- reading
    @property
    def num_sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets.diff()

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """The offsets as int32, what variable-length attention kernels take."""
        return self.offsets.to(torch.int32)

    def sequence(self, i: int) -> torch.Tensor:
        return self.values[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def sequence_index(self) -> torch.Tensor:
        """[T] the sequence each value belongs to."""
        return torch.repeat_interleave(torch.arange(self.num_sequences, device=self.offsets.device), self.lengths)

    def positions(self) -> torch.Tensor:
        """[T] each value's index within its sequence."""
        index = torch.arange(self.values.shape[0], device=self.offsets.device)
        return index - self.offsets[:-1][self.sequence_index()]

    def with_values(self, values: torch.Tensor) -> VarLen:
        """Another per-token field over the same sequences (no copy of either)."""
        return VarLen(values, self.offsets)

    def to_padded(
        self, width: int | None = None, fill: float | bool = 0, left: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """([N, W, ...] values, [N, W] bool mask), right-padded (or ``left``) to ``width``
        (default: the longest sequence)."""
        lengths = self.lengths
        longest = int(lengths.max()) if self.num_sequences else 0
        width = longest if width is None else width
        if width < longest:
            raise ValueError(f"VarLen.to_padded: width {width} is shorter than the longest sequence ({longest})")
        shape = (self.num_sequences, width, *self.values.shape[1:])
        out = torch.full(shape, fill, dtype=self.values.dtype, device=self.values.device)
        columns = self.positions() + ((width - lengths)[self.sequence_index()] if left else 0)
        mask = torch.zeros(self.num_sequences, width, dtype=torch.bool, device=self.values.device)
        mask[self.sequence_index(), columns] = True
        out[mask] = self.values
        return out, mask
