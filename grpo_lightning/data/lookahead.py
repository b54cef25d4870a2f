"""Batches that carry the prompts of the next few steps too (for asynchronous generation).

To generate the batch of step t + k while the module trains on step t, the rollout callback
must know step t + k's prompts at step t. :class:`LookaheadLoader` wraps the prompt loader
and yields :class:`PromptWindow` items: the prompts of this step plus those of the next
``lookahead`` steps, read from the same seeded loader, so every step gets exactly the
prompts it gets in sync mode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import NamedTuple


class PromptWindow(NamedTuple):
    """The records of this step (``current``) and of the next steps, nearest first (``ahead``)."""

    current: list[dict]
    ahead: list[list[dict]]


def current_records(batch) -> list[dict]:
    """The records of this step, whether ``batch`` is a plain record list or a window."""
    return batch.current if isinstance(batch, PromptWindow) else batch


class LookaheadLoader:
    """Wraps a loader of record lists; yields windows of 1 + ``lookahead`` consecutive batches."""

    def __init__(self, loader: Iterable[list[dict]], lookahead: int):
        if lookahead < 1:
            raise ValueError(f"lookahead={lookahead} must be >= 1")
        self.loader = loader
        self.lookahead = lookahead

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[PromptWindow]:
        window: deque[list[dict]] = deque()
        for batch in self.loader:
            window.append(batch)
            if len(window) > self.lookahead:
                yield PromptWindow(window[0], list(window)[1:])
                window.popleft()
        while window:
            yield PromptWindow(window[0], list(window)[1:])
            window.popleft()
