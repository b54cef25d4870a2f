"""What a reward function may return: one number (or None) per completion, nothing else.

``float()`` alone is too lenient: it turns the string ``"1"`` into a reward, and ``list()`` of a
dict trains on its keys. A number here is what TRL's ``torch.tensor(rewards)`` takes as one:
``int``, ``float``, ``bool`` (TRL scores a bool as 0 or 1), numpy and one-element torch scalars.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from grpo_lightning.errors import RewardError

# The containers of per-completion values; a dict, a string or a set is not one.
_SEQUENCES = (list, tuple, np.ndarray, torch.Tensor)


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (None passes through); raises TypeError otherwise."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and not value.is_complex():
            return float(value)
    elif isinstance(value, (numbers.Real, np.bool_)) and not isinstance(value, (str, bytes)):
        return float(value)
    raise TypeError(type(value).__name__)


def as_reward(value: Any) -> float | None:
    """One reward value (an environment step's) as a float or None; TypeError for anything else."""
    return _number(value)


def reward_values(name: str, values: Any, expected: int, error: type[RewardError] = RewardError) -> list[float | None]:
    """``values`` as ``expected`` floats or Nones, or ``error`` naming ``name``, the index and the type."""
    if not isinstance(values, _SEQUENCES) or (isinstance(values, (np.ndarray, torch.Tensor)) and values.ndim != 1):
        raise error(
            f"reward function {name!r} must return a list of floats (or None for a sample it does not "
            f"apply to), one per completion; got a {type(values).__name__}"
        )
    out = []
    for index, value in enumerate(values):
        try:
            out.append(_number(value))
        except TypeError:
            raise error(
                f"reward function {name!r} must return a list of floats (or None for a sample it does not "
                f"apply to); value {index} is a {type(value).__name__}: {value!r:.60}"
            ) from None
    if len(out) != expected:
        raise error(f"reward function {name!r} returned {len(out)} values for {expected} completions")
    return out
