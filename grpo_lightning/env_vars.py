"""Setting an environment variable for a block only (the standard library has no such helper:
``unittest.mock.patch.dict`` restores the whole environment, undoing what the block's code
set for later, as vLLM's start-up does)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """``name=value`` inside the block (processes started in it inherit it); its previous value,
    or its absence, after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
