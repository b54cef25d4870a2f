"""Structured configs, one module per group: every field has a default and one line of help,
and each group validates its own fields right below them (``check_fields``).

Hydra composes ``grpo_lightning/conf/`` onto :class:`TrainConfig` (:mod:`.compose`);
:func:`validate_config` rejects invalid values before any model loads, naming each field.
The schema is the lowest layer: it imports nothing from rewards/, data/, models/ or rollout/.
"""

from grpo_lightning.config.algorithm import AlgorithmConfig
from grpo_lightning.config.base import Schema, UnknownFieldError, field_help
from grpo_lightning.config.eval import EvalConfig
from grpo_lightning.config.health import HEALTH_ACTIONS, HEALTH_CHECKS, CheckConfig, HealthConfig
from grpo_lightning.config.logger import LOGGERS, LoggerConfig
from grpo_lightning.config.model import (
    CHECKPOINTING_MODES,
    MODEL_DTYPES,
    LoraModelConfig,
    ModelConfig,
    TinyModelConfig,
    checkpointing_mode,
)
from grpo_lightning.config.rollout import (
    HF_DECODERS,
    ROLLOUT_MODES,
    RolloutConfig,
    VLLMConfig,
    VLLMServerConfig,
    VLLMSyncConfig,
    is_loopback_host,
)
from grpo_lightning.config.task import TASKS, TaskConfig, task_options
from grpo_lightning.config.teacher import TEACHER_KINDS, TeacherConfig, register_teacher_kind
from grpo_lightning.config.train import TrainConfig, register_config_check, validate_config
from grpo_lightning.config.trainer import STRATEGIES, TrainerConfig
from grpo_lightning.errors import ConfigError

__all__ = [
    "CHECKPOINTING_MODES",
    "HEALTH_ACTIONS",
    "HEALTH_CHECKS",
    "HF_DECODERS",
    "LOGGERS",
    "MODEL_DTYPES",
    "ROLLOUT_MODES",
    "STRATEGIES",
    "TASKS",
    "TEACHER_KINDS",
    "AlgorithmConfig",
    "CheckConfig",
    "ConfigError",
    "EvalConfig",
    "HealthConfig",
    "LoggerConfig",
    "LoraModelConfig",
    "ModelConfig",
    "RolloutConfig",
    "Schema",
    "TaskConfig",
    "TeacherConfig",
    "TinyModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "UnknownFieldError",
    "VLLMConfig",
    "VLLMServerConfig",
    "VLLMSyncConfig",
    "checkpointing_mode",
    "field_help",
    "is_loopback_host",
    "register_config_check",
    "register_teacher_kind",
    "task_options",
    "validate_config",
]
