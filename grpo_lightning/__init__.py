"""grpo_lightning: GRPO as a PyTorch Lightning module plus callbacks, built never to fail silently."""

from grpo_lightning.models.allocator import prefer_huge_pages

# Before anything below imports lightning (whose import allocates): torch reads the switch once,
# at its first CPU allocation. Large CPU tensors on huge pages: less peak memory, same speed.
prefer_huge_pages()

from grpo_lightning import tasks as _tasks  # noqa: E402, F401  (registers the built-in tasks and their rewards)
from grpo_lightning.config import TrainConfig, validate_config
from grpo_lightning.module import GRPOModule
from grpo_lightning.rollout import HFEngine, RolloutBatch, RolloutGenerator, SamplingSettings

__all__ = [
    "GRPOModule",
    "HFEngine",
    "RolloutBatch",
    "RolloutGenerator",
    "SamplingSettings",
    "TrainConfig",
    "validate_config",
]
