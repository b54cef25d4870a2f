"""The typed records of the one-way flow: prompts -> rollout -> step -> monitor -> sync.

An engine returns :class:`Completion` records (token ids, log-probs and weight version per
token); the rollout assembles them into a :class:`RolloutBatch`; the step turns that batch
into a :class:`StepResult` (one :class:`PassStats` per pass over the batch), which the health
monitor reads. ``varlen`` holds the variable-length layout, ``plain_state`` the plain-data form
of what a checkpoint saves. This package imports only torch and the stdlib: the lowest layer,
so every layer above may use it (plug-ins: ``from grpo_lightning.records import Completion``).
"""

from grpo_lightning.records.rollout import TOKEN_FIELDS, Completion, RolloutBatch
from grpo_lightning.records.step import (
    AggregationRecord,
    CapturedRows,
    PassStats,
    PolicyWeights,
    StepContext,
    StepResult,
    TokenLogProbs,
)
from grpo_lightning.records.varlen import VarLen
from grpo_lightning.records.vision import VisionInputs

__all__ = [
    "TOKEN_FIELDS",
    "AggregationRecord",
    "CapturedRows",
    "Completion",
    "PassStats",
    "PolicyWeights",
    "RolloutBatch",
    "StepContext",
    "StepResult",
    "TokenLogProbs",
    "VarLen",
    "VisionInputs",
]
