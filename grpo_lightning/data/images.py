"""A prompt's images as rows carry them, decoded and identified.

Rows carry images as TRL's datasets do: an ``images`` column (a list) or an ``image`` column (one
image). Each image may be a PIL image, raw bytes, a file path (relative paths are read from the
data file's folder), a ``data:image/...;base64,`` string, or what a ``datasets`` Image feature
holds (``{"bytes": ..., "path": ...}``). An image's identity is a hash of its decoded pixels, so
the same picture from a path or from bytes is one image, and one question over two pictures is
two prompts.
"""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path
from typing import Any

from PIL import Image

IMAGE_COLUMNS = ("images", "image")
_DATA_URI = "data:image/"


def image_refs(record: dict) -> list:
    """The images of a row, as stored: its ``images`` list, or its one ``image``; [] for none."""
    if record.get("images") is not None:
        images = record["images"]
        return list(images) if isinstance(images, (list, tuple)) else [images]
    if record.get("image") is not None:
        return [record["image"]]
    return []


def resolve_paths(records: list[dict], folder: Path) -> None:
    """Relative image paths of ``records`` made absolute against ``folder`` (the data file's) where a file
    is there, so they load from any working folder; other paths are left for the check to name."""
    for record in records:
        for column in IMAGE_COLUMNS:
            value = record.get(column)
            if isinstance(value, (list, tuple)):
                record[column] = [_resolved(v, folder) for v in value]
            elif value is not None:
                record[column] = _resolved(value, folder)


def _resolved(ref: Any, folder: Path) -> Any:
    if isinstance(ref, dict) and not ref.get("bytes") and isinstance(ref.get("path"), str):
        return {**ref, "path": _resolved(ref["path"], folder)}
    if isinstance(ref, str) and not ref.startswith(_DATA_URI) and not Path(ref).expanduser().is_absolute():
        candidate = folder / ref
        return str(candidate) if candidate.is_file() else ref
    return ref


def describe(ref: Any) -> str:
    """How an error message names an image: its path, or what it is."""
    if isinstance(ref, str):
        return "a base64 data URI" if ref.startswith(_DATA_URI) else repr(ref)
    if isinstance(ref, dict):
        return repr(ref["path"]) if ref.get("path") and not ref.get("bytes") else "the bytes of a datasets Image"
    if isinstance(ref, (bytes, bytearray)):
        return f"{len(ref)} bytes"
    return type(ref).__name__


def ref_path(ref: Any) -> str | None:
    """The file path an image came from, if any."""
    if isinstance(ref, str) and not ref.startswith(_DATA_URI):
        return ref
    if isinstance(ref, dict) and isinstance(ref.get("path"), str) and ref.get("path"):
        return ref["path"]
    return None


def load_image(ref: Any) -> Image.Image:
    """An RGB PIL image from any of the forms above; FileNotFoundError, or PIL's error for bytes it cannot read."""
    if isinstance(ref, Image.Image):
        image = ref
    elif isinstance(ref, (bytes, bytearray)):
        image = Image.open(io.BytesIO(bytes(ref)))
    elif isinstance(ref, dict) and ref.get("bytes"):
        image = Image.open(io.BytesIO(ref["bytes"]))
    elif isinstance(ref, str) and ref.startswith(_DATA_URI):
        image = Image.open(io.BytesIO(base64.b64decode(ref.split(",", 1)[1])))
    elif ref_path(ref) is not None:
        path = Path(ref_path(ref)).expanduser()
        if not path.is_file():
            raise FileNotFoundError(str(path))
        image = Image.open(path)
    else:
        raise TypeError(f"an image must be a PIL image, bytes, a path or a data URI, not {type(ref).__name__}")
    image.load()  # decode now: a truncated file fails here, not in the processor
    return image if image.mode == "RGB" else image.convert("RGB")


def image_hash(image: Image.Image) -> str:
    """16 hex digits of blake2b over the decoded pixels (size and mode included)."""
    digest = hashlib.blake2b(digest_size=8, person=b"grpo-image")
    digest.update(f"{image.mode}{image.size}".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def ref_name(ref: Any, image: Image.Image) -> str:
    """What tables and completions.jsonl record for an image: its path, or its pixel hash."""
    return ref_path(ref) or f"sha:{image_hash(image)}"


def ref_key(ref: Any) -> object:
    """A cheap, stable key of an image as stored, for caches and set membership (no decoding): its path,
    a hash of its bytes, or the object itself (a PIL image held by its row for the run)."""
    if isinstance(ref, (bytes, bytearray)):
        return ("bytes", hash(bytes(ref)))
    if isinstance(ref, dict):
        return ("dict", ref.get("path"), hash(ref.get("bytes") or b""))
    if isinstance(ref, str):
        return ("str", ref)
    return ("object", id(ref))
