"""``ResumableLoader``: the prompt loader resumes where the checkpointed run stopped.

Lightning saves a loader's ``state_dict`` in the checkpoint and, on resume, hands it back to
``load_state_dict`` before iterating; the loader must then yield only the batches not yet
trained on (otherwise Lightning warns "your dataloader is not resumable" and the resumed run
sees the first prompts again). The prompt order is a seeded function of the run seed, so the
position alone (batches whose training step ran) restores it exactly: the first ``position``
batches of the same stream are skipped (cheap: they are lists of records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator


class ResumableLoader:
    """Wraps a loader of batches; ``position()`` counts the batches the training steps consumed."""

    def __init__(self, loader: Iterable, position: Callable[[], int]):
        self.loader = loader
        self.position = position
        self._skip = 0

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict:
        return {"batches_done": int(self.position())}

    def load_state_dict(self, state_dict: dict) -> None:
        self._skip = int(state_dict["batches_done"])

    def __iter__(self) -> Iterator:
        skip, self._skip = self._skip, 0
        iterator = iter(self.loader)
        for _ in range(skip):
            next(iterator, None)
        return iterator
