"""The config rule that needs the engine registry: ``rollout.engine`` names a registered engine
(a built-in or one a ``plugins=[...]`` file registered), with the closest match suggested.

Registered with :func:`grpo_lightning.config.register_config_check` on import, so the schema
layer stays free of imports from here.
"""

from __future__ import annotations

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.rollout.engine import ENGINES


@register_config_check
def engine_name_problems(cfg: TrainConfig) -> list[str]:
    """An unknown ``rollout.engine``."""
    problem = ENGINES.problem(cfg.rollout.engine)
    return [problem] if problem else []
