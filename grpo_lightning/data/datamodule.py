"""Prompts for the rollout callback: a DataModule over plain records (dicts with a "prompt")."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, RandomSampler


def _as_list(records: list[dict]) -> list[dict]:
    return records


class PromptDataModule(L.LightningDataModule):
    """Yields lists of ``prompts_per_step`` records; every other column reaches the rewards.

    The training loader draws seeded permutations of the prompts and drops incomplete
    batches, so every generation batch has the same number of groups. With ``num_batches``
    one epoch is exactly that many batches (permutation after permutation), so a run of
    N steps is one epoch and the progress bar counts steps.
    """

    def __init__(
        self,
        train_records: list[dict],
        val_records: list[dict] | None = None,
        prompts_per_step: int = 8,
        seed: int = 0,
        num_batches: int | None = None,
        val_batch_size: int | None = None,
    ):
        super().__init__()
        missing = [i for i, r in enumerate(train_records) if "prompt" not in r]
        if missing:
            raise ValueError(f"records {missing[:5]} have no 'prompt' field; every record needs one")
        if len(train_records) < prompts_per_step:
            raise ValueError(
                f"rollout.prompts_per_step={prompts_per_step} exceeds the {len(train_records)} "
                f"training prompts; lower it or use a larger task"
            )
        self.train_records = train_records
        self.val_records = val_records or []
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.num_batches = num_batches
        self.val_batch_size = val_batch_size or prompts_per_step

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        num_samples = (self.num_batches or len(self.train_records) // self.prompts_per_step) * self.prompts_per_step
        sampler = RandomSampler(self.train_records, num_samples=num_samples, generator=generator)
        return DataLoader(
            self.train_records,
            batch_size=self.prompts_per_step,
            sampler=sampler,
            drop_last=True,
            collate_fn=_as_list,
        )

    def val_dataloader(self) -> DataLoader:
        """The held-out records in order (no shuffling: every evaluation sees the same prompts)."""
        return DataLoader(self.val_records, batch_size=self.val_batch_size, shuffle=False, collate_fn=_as_list)
