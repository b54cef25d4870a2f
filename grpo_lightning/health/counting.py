"""Counting equal values by sorting, never by comparing every pair.

The checks that look for identical samples compared each sample with every other of its group
(``a[:, :, None] == a[:, None, :]``): memory quadratic in the group size, 149 GiB for one step
of ``rollout.num_generations=100000``. The same counts come from sorting: O(n log n) time and
O(n) memory. Rows (groups, prompts) are folded into the keys, so one sort serves every row.
"""

from __future__ import annotations

import numpy as np


def pair_keys(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """One int64 per ``(first[i], second[i])`` pair, equal exactly when both are (dense codes of each)."""
    _, a = np.unique(first.ravel(), return_inverse=True)
    _, b = np.unique(second.ravel(), return_inverse=True)
    return (a.astype(np.int64) * (int(b.max(initial=0)) + 1) + b).reshape(np.shape(first))


def row_keys(values: np.ndarray) -> np.ndarray:
    """``values`` [rows, cols] as keys equal exactly when the row and the value are."""
    rows = np.broadcast_to(np.arange(values.shape[0])[:, None], values.shape)
    return pair_keys(rows, values)


def count_in(pool: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each of ``values``, how many elements of ``pool`` equal it."""
    ordered = np.sort(pool.ravel())
    flat = values.ravel()
    counts = np.searchsorted(ordered, flat, side="right") - np.searchsorted(ordered, flat, side="left")
    return counts.reshape(values.shape)


def max_where_equal(keys: np.ndarray, weights: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each of ``queries``, the largest of ``weights`` whose key equals it; 0 where none does
    (or where all of them are below 0: as ``(match * weights).max()`` over every pair gives)."""
    order = np.argsort(keys.ravel(), kind="stable")
    ordered, by_key = keys.ravel()[order], weights.ravel()[order]
    if ordered.size == 0:
        return np.zeros(queries.shape)
    unique, starts = np.unique(ordered, return_index=True)
    best = np.maximum(np.maximum.reduceat(by_key, starts), 0.0)
    at = np.minimum(np.searchsorted(unique, queries.ravel()), len(unique) - 1)
    found = unique[at] == queries.ravel()
    return np.where(found, best[at], 0.0).reshape(queries.shape)
