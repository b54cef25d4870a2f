"""Writing tensors over their own bytes in a safetensors folder that transformers wrote.

A LoRA policy is exported merged: ``W + scale * B @ A`` for every adapted weight, most of the
model. Made all at once they were a second copy of those weights at the end of a run (425 MB on
SmolLM2-135M, gigabytes on a 7B model: the run's highest memory). Instead transformers writes
the unmerged weights (its names, tied weights, shards and index), and :func:`overwrite_tensors`
then makes each merged weight and writes it where its unmerged bytes are, one at a time.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length,
a JSON header mapping each name to its dtype, shape and ``data_offsets`` (from the end of the
header), then the data.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
}


def tensor_places(folder: Path) -> dict[str, tuple[Path, str, list[int], int, int]]:
    """name -> (file, dtype, shape, first byte, end byte) of every tensor in ``folder``'s weight files."""
    index = folder / INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [SINGLE]
    places = {}
    for name in files:
        path = folder / name
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        start = 8 + length
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            places[key] = (path, entry["dtype"], entry["shape"], start + begin, start + end)
    return places


def overwrite_tensors(
    folder: str | Path, tensors: Mapping[str, tuple[torch.Tensor, Callable[[], torch.Tensor]]]
) -> bool:
    """Write ``make()`` over each named tensor's bytes in ``folder``; ``tensors``: name -> (the tensor
    written there now, make). Each result is made, written and dropped before the next is made.

    Returns False, having written nothing, if any name is missing from the files or was written with
    another dtype or shape (a model whose weights transformers renames or converts on save).
    """
    folder = Path(folder)
    places = tensor_places(folder)
    for name, (written, _) in tensors.items():
        place = places.get(name)
        dtype = SAFETENSORS_DTYPES.get(written.dtype)
        if place is None or dtype is None or place[1] != dtype or list(place[2]) != list(written.shape):
            return False
    for name, (written, make) in tensors.items():
        path, _, _, begin, end = places[name]
        tensor = make()
        if tensor.dtype != written.dtype or tensor.shape != written.shape:
            raise ValueError(
                f"{name}: made {tensor.dtype} {tuple(tensor.shape)}, the file holds "
                f"{written.dtype} {tuple(written.shape)}"
            )
        data = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy()
        if data.nbytes != end - begin:
            raise ValueError(f"{name}: {data.nbytes} bytes for a {end - begin}-byte place in {path.name}")
        with path.open("r+b") as f:
            f.seek(begin)
            f.write(data)
        del tensor, data
    return True
