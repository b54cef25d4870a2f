"""Prompts for the rollout callback: a DataModule over plain records (dicts with a "prompt")."""

from __future__ import annotations

import lightning as L
from torch.utils.data import DataLoader

from grpo_lightning.data.lookahead import LookaheadLoader
from grpo_lightning.data.mixture import MixtureSampler, source_batches, source_of
from grpo_lightning.data.resumable import ResumableLoader
from grpo_lightning.data.sampler import PromptSampler
from grpo_lightning.errors import ConfigError


def _as_list(records: list[dict]) -> list[dict]:
    return records


class PromptDataModule(L.LightningDataModule):
    """Yields lists of ``prompts_per_step`` records; every other column reaches the rewards.

    The training loader draws seeded permutations of the prompts and drops incomplete
    batches, so every generation batch has the same number of groups. With ``num_batches``
    one epoch is exactly that many batches (permutation after permutation), so a run of
    N steps is one epoch and the progress bar counts steps. Under DDP every rank gets
    ``prompts_per_step`` prompts per step, different from the other ranks' (``PromptSampler``).
    With ``lookahead`` > 0 (async generation) each batch is a
    :class:`~grpo_lightning.data.lookahead.PromptWindow` that also carries the prompts of
    the next ``lookahead`` steps.
    """

    def __init__(
        self,
        train_records: list[dict],
        val_records: list[dict] | None = None,
        prompts_per_step: int = 8,
        seed: int = 0,
        num_batches: int | None = None,
        lookahead: int = 0,
        val_batch_size: int | None = None,
        source_weights: dict[str, float] | None = None,
        needs_prompts: bool = True,
    ):
        super().__init__()
        missing = [i for i, r in enumerate(train_records) if "prompt" not in r]
        if missing and needs_prompts:  # (episode tasks hand their rows to the environment as they are)
            raise ValueError(f"records {missing[:5]} have no 'prompt' field; every record needs one")
        if len(train_records) < prompts_per_step:
            raise ConfigError(
                f"rollout.prompts_per_step={prompts_per_step} exceeds the {len(train_records)} "
                f"training prompts; lower it or use a larger task"
            )
        self.train_records = train_records
        self.val_records = val_records or []
        self.prompts_per_step = prompts_per_step
        self.seed = seed
        self.num_batches = num_batches
        self.lookahead = lookahead
        self.val_batch_size = val_batch_size or prompts_per_step
        self.source_weights = source_weights

    def train_sampler(self, rank: int, world: int) -> PromptSampler:
        """The seeded order of rank ``rank``'s training prompts (indices into ``train_records``): what the
        loader batches, and what the pipeline's producer draws from (``rollout/pipeline/stream.py``)."""
        per_rank = self.num_batches or len(self.train_records) // (self.prompts_per_step * world)
        shape = dict(seed=self.seed, rank=rank, world_size=world, batch_size=self.prompts_per_step)
        if self.source_weights:
            sources = [source_of(r) for r in self.train_records]
            return MixtureSampler(sources, self.source_weights, per_rank * self.prompts_per_step, **shape)
        return PromptSampler(len(self.train_records), per_rank * self.prompts_per_step, **shape)

    def train_dataloader(self) -> ResumableLoader:
        trainer = self.trainer  # None outside a Trainer (e.g. in a notebook or a unit test)
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        sampler = self.train_sampler(rank, world)
        loader = DataLoader(
            self.train_records,
            batch_size=self.prompts_per_step,
            sampler=sampler,
            drop_last=True,
            collate_fn=_as_list,
        )
        loader = LookaheadLoader(loader, self.lookahead) if self.lookahead > 0 else loader
        # Resumable: a checkpoint records how many batches were trained on (Lightning's count).
        return ResumableLoader(
            loader, lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer else 0
        )

    def val_dataloader(self) -> DataLoader:
        """The held-out records in order (no shuffling: every evaluation sees the same prompts)."""
        if any(source_of(r) is not None for r in self.val_records):  # one source per batch
            batches = source_batches(self.val_records, self.val_batch_size)
            return DataLoader(batches, batch_size=None, shuffle=False, collate_fn=_as_list)
        return DataLoader(self.val_records, batch_size=self.val_batch_size, shuffle=False, collate_fn=_as_list)
