"""Cheap, rank-independent fingerprints of token sequences (64-bit hashes) for duplicate counting.

Python's ``hash(str)`` is salted per process, so it cannot be compared across ranks; these
are linear hashes with fixed random odd weights (int64 arithmetic wraps), vectorized over a
batch: about 10 microseconds for 128 sequences. Two different sequences collide with a
probability of order 2**-60, far below any duplicate rate a check cares about.
"""

from __future__ import annotations

import numpy as np

_rng = np.random.default_rng(0x6A09E667)
_weights = np.empty(0, dtype=np.int64)
_LENGTH_WEIGHT = np.int64(0x5851F42D4C957F2D)


def _weights_for(width: int) -> np.ndarray:
    global _weights
    if len(_weights) < width:
        extra = _rng.integers(1, 2**62, size=max(width, 2 * len(_weights)) - len(_weights), dtype=np.int64)
        _weights = np.concatenate([_weights, extra | 1])
    return _weights[:width]


def sequence_hashes(ids: np.ndarray, mask: np.ndarray, right_aligned: bool = False) -> np.ndarray:
    """One int64 per row of ``ids`` [N, T], over the tokens where ``mask`` is set.

    ``right_aligned`` weights positions from the last column (left-padded prompts), so the
    hash of a prompt does not depend on how wide its batch was padded.
    """
    width = ids.shape[1]
    weights = _weights_for(width)
    if right_aligned:
        weights = weights[::-1]
    tokens = (ids.astype(np.int64) + 1) * mask.astype(np.int64)
    with np.errstate(over="ignore"):
        return (tokens * weights).sum(axis=1) + mask.sum(axis=1).astype(np.int64) * _LENGTH_WEIGHT
