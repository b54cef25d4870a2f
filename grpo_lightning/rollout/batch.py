"""``RolloutBatch`` lives with the other records of the flow in :mod:`grpo_lightning.records`."""

from grpo_lightning.records import RolloutBatch

__all__ = ["RolloutBatch"]
