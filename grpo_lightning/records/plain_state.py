"""Checkpoint state as plain data: what ``torch.load(weights_only=True)`` reads without running code.

A pickled object in a checkpoint runs code when it is loaded, so the state the package saves
is only tensors, ``None``, bools, numbers, strings, lists and string-keyed dicts. ``to_plain``
turns the few other things our state holds (tuples, deques, numpy arrays and scalars, dicts
with other keys, dataclasses) into tagged dicts of those; ``from_plain`` turns them back,
exactly (same types, dtypes, bits), and builds dataclasses only from the ``classes`` it is
given: a checkpoint names data, never a class to construct.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np
import torch

from grpo_lightning.errors import CheckpointError


class RefusedState(CheckpointError):
    """A state in a checkpoint that is not ours as plain data; ``fit_refusing_code`` adds the file's name."""

    @classmethod
    def pickled(cls, what: str) -> RefusedState:
        """``what`` was saved pickled, by a version before plain state: never unpickled."""
        return cls(f"its {what} is pickled (written by an older grpo_lightning), so it is refused: {NOT_CODE}")


NOT_CODE = "checkpoints are data, never code"
TAG = "__plain__"  # the key of a tagged value; a dict holding it is itself saved tagged
_SCALARS = (type(None), bool, int, float, str)


def to_plain(value, where: str = "state"):
    """``value`` as plain data; ``where`` names it in the error for a type we cannot save."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float
        return {TAG: "numpy_scalar", **_array(np.asarray(value))}
    if type(value) in _SCALARS or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return {TAG: "ndarray", **_array(value)}
    if type(value) is list:
        return [to_plain(v, where) for v in value]
    if type(value) is tuple:
        return {TAG: "tuple", "items": [to_plain(v, where) for v in value]}
    if type(value) is deque:
        return {TAG: "deque", "items": [to_plain(v, where) for v in value], "maxlen": value.maxlen}
    if type(value) is dict:
        if all(type(k) is str for k in value) and TAG not in value:
            return {k: to_plain(v, f"{where}.{k}") for k, v in value.items()}
        return {TAG: "dict", "items": [[to_plain(k, where), to_plain(v, where)] for k, v in value.items()]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: to_plain(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
        return {TAG: "dataclass", "type": type(value).__name__, "fields": fields}
    raise TypeError(f"{where} holds a {type(value).__name__}, which a checkpoint cannot hold as plain data")


def from_plain(value, classes: tuple[type, ...] = ()):
    """The inverse of :func:`to_plain`; dataclasses only of ``classes`` (else :class:`RefusedState`)."""
    if type(value) is list:
        return [from_plain(v, classes) for v in value]
    if type(value) is not dict:
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: from_plain(v, classes) for k, v in value.items()}
    if kind in ("ndarray", "numpy_scalar"):
        array = np.frombuffer(value["data"].numpy().tobytes(), dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        return array[()] if kind == "numpy_scalar" else array.copy()
    items = [from_plain(v, classes) for v in value.get("items", [])]
    if kind == "tuple":
        return tuple(items)
    if kind == "deque":
        return deque(items, maxlen=value["maxlen"])
    if kind == "dict":
        return dict(items)
    if kind == "dataclass":
        known = {cls.__name__: cls for cls in classes}
        if value["type"] not in known:
            raise RefusedState(f"the checkpoint's state names a {value['type']!r}, not one of {sorted(known)}")
        return known[value["type"]](**from_plain(value["fields"], classes))
    raise RefusedState(f"the checkpoint's state holds an unknown kind of value {kind!r}")


def _array(array: np.ndarray) -> dict:
    """A numpy array as its dtype, shape and raw bytes (exact for every dtype but ``object``)."""
    if array.dtype.hasobject:
        raise TypeError("a numpy array of Python objects cannot be saved as plain data")
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": torch.from_numpy(raw.copy())}
