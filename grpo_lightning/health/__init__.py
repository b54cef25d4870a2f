"""Health checks that diagnose the failures F1-F8 (docs/failure_modes.md) while a run trains.

Each check is one file that registers its class and its options dataclass
(``@register_check(Options)``, ``health.<name>.*``); importing this package registers them all.
Each check reads one step (:class:`StepView`), returns sums that the monitor adds over
ranks, and turns the totals into metrics and, when the step looks wrong, a ``Finding``.
The callback (:class:`grpo_lightning.callbacks.HealthMonitor`) applies patience and the
configured action and writes the diagnosis.
"""

from grpo_lightning.config.health import HEALTH_CHECKS
from grpo_lightning.health.alerts import ACTIONS, Alert, Finding, HealthCheckError, HealthWarning
from grpo_lightning.health.base import HealthCheck
from grpo_lightning.health.constant_reward import ConstantRewardCheck
from grpo_lightning.health.degenerate import DegenerateOutputCheck
from grpo_lightning.health.distillation import DistillKLCheck, DistillRewardCheck
from grpo_lightning.health.diversity import DiversityCheck
from grpo_lightning.health.duplicates import CrossRankDuplicatesCheck
from grpo_lightning.health.episode_failures import EpisodeFailuresCheck
from grpo_lightning.health.episode_limits import EpisodeLimitsCheck
from grpo_lightning.health.mismatch import MismatchCheck
from grpo_lightning.health.no_update import NoUpdateCheck
from grpo_lightning.health.nonfinite import NonFiniteCheck
from grpo_lightning.health.normalization import NormalizationCheck
from grpo_lightning.health.pipeline_lag import PipelineLagCheck
from grpo_lightning.health.reward_hacking import RewardHackingCheck
from grpo_lightning.health.reward_hacks import RewardHacksCheck
from grpo_lightning.health.reward_signal import RewardSignalCheck
from grpo_lightning.health.truncation import TruncationCheck
from grpo_lightning.health.view import StepView

# Every registered check class by name (the built-in ones above, and any a plug-in file adds).
CHECK_CLASSES = HEALTH_CHECKS.entries

__all__ = [
    "ACTIONS",
    "CHECK_CLASSES",
    "ConstantRewardCheck",
    "Alert",
    "CrossRankDuplicatesCheck",
    "DegenerateOutputCheck",
    "DistillKLCheck",
    "DistillRewardCheck",
    "DiversityCheck",
    "EpisodeFailuresCheck",
    "EpisodeLimitsCheck",
    "Finding",
    "HealthCheck",
    "HealthCheckError",
    "HealthWarning",
    "MismatchCheck",
    "NoUpdateCheck",
    "NonFiniteCheck",
    "NormalizationCheck",
    "PipelineLagCheck",
    "RewardHackingCheck",
    "RewardHacksCheck",
    "RewardSignalCheck",
    "TruncationCheck",
    "StepView",
]
