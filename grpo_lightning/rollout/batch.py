"""``RolloutBatch`` lives with the other records of the flow in :mod:`grpo_lightning.step`."""

from grpo_lightning.step import RolloutBatch

__all__ = ["RolloutBatch"]
