"""Cheap, rank-independent fingerprints of completions and prompts (64-bit hashes) for
duplicate counting.

Python's ``hash(str)`` is salted per process, so it cannot be compared across ranks.
Completions get a linear hash with fixed random odd weights, one int64 matrix-vector
product per batch (integer arithmetic wraps modulo 2**64, so the result does not depend on
summation order or machine); prompts get blake2b of their text, cached per text. Two
different sequences collide with a probability of order 2**-60, far below any duplicate
rate a check cares about.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

_LENGTH_WEIGHT = 0x5851F42D4C957F2D
_weights = torch.empty(0, dtype=torch.long)


def _weights_for(width: int) -> torch.Tensor:
    global _weights
    if len(_weights) < width:
        rng = np.random.default_rng(0x6A09E667)  # the same weights on every rank, every run
        _weights = torch.from_numpy(rng.integers(1, 2**62, size=max(width, 64), dtype=np.int64) | 1)
    return _weights[:width]


def completion_hashes(ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """One int64 per row of ``ids`` [N, T] over the tokens where ``mask`` is set (right-padded)."""
    ids, mask = ids.detach().cpu().long(), mask.detach().cpu().long()
    tokens = (ids + 1) * mask
    return (torch.mv(tokens, _weights_for(ids.shape[1])) + mask.sum(dim=1) * _LENGTH_WEIGHT).numpy()


class TextHashes:
    """blake2b-64 of each text, cached: a run sees each prompt many times."""

    def __init__(self, max_size: int = 1_000_000):
        self._cache: dict[str, int] = {}
        self.max_size = max_size

    def __call__(self, texts: list[str]) -> np.ndarray:
        cache, out = self._cache, []
        for text in texts:
            value = cache.get(text)
            if value is None:
                digest = hashlib.blake2b(text.encode(), digest_size=8, person=b"grpo-prompt").digest()
                value = int.from_bytes(digest, "little", signed=True)
                if len(cache) < self.max_size:
                    cache[text] = value
            out.append(value)
        return np.array(out, dtype=np.int64)


def token_hashes(ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """Prompt hashes from token ids (left-padded), for batches that carry no prompt texts."""
    ids, mask = ids.detach().cpu().long(), mask.detach().cpu().long()
    flipped = ((ids + 1) * mask).flip(dims=[1])  # weight positions from the last column
    return (torch.mv(flipped, _weights_for(ids.shape[1])) + mask.sum(dim=1) * _LENGTH_WEIGHT).numpy()
