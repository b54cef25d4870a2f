"""grpo_lightning/config/registered_names.json, written from the registries: the built-in names the
CLI's early check (config/early_names.py) knows without importing torch.

The registries fill as their modules, which import torch, load; a typo in a registered name
would otherwise wait for those imports. The file is generated rather than kept by hand:
``python -m grpo_lightning.registered_index`` rewrites it, and
``tests/unit/config/test_registered_names.py`` fails when it is stale. Plug-ins (``plugins=[...]``,
``task.reward_modules``) are not in it: a command line that names them is judged by the full path.

It imports the registries, so it sits above the schema (like config_docs).
"""

from __future__ import annotations

import importlib
import json
import sys

from grpo_lightning.config.early_names import INDEX_FILE
from grpo_lightning.registry import Registry

# (config field, "module:attribute" of its registry or tuple of allowed values, kind in messages).
# The kind is None for a fixed tuple: its message is config.base.choice's "is not allowed".
SOURCES = (
    ("task.name", "grpo_lightning.config.task:TASKS"),
    ("task.rewards", "grpo_lightning.rewards.registry:REWARD_FUNCTIONS"),
    ("rollout.engine", "grpo_lightning.rollout.engine:ENGINES"),
    ("algorithm.policy_loss", "grpo_lightning.algorithm.policy_loss:POLICY_LOSSES"),
    ("algorithm.advantage_estimator", "grpo_lightning.algorithm.advantages:ADVANTAGE_ESTIMATORS"),
    ("algorithm.kl_estimator", "grpo_lightning.algorithm.kl:KL_ESTIMATORS"),
    ("algorithm.loss_agg", "grpo_lightning.algorithm.aggregation:LOSS_AGG_MODES"),
    ("algorithm.corrections", "grpo_lightning.algorithm.corrections.base:CORRECTIONS"),
    ("algorithm.advantage_scale", "grpo_lightning.algorithm.advantages:ADVANTAGE_SCALES"),
    ("algorithm.is_level", "grpo_lightning.algorithm.importance:IS_LEVELS"),
    ("algorithm.correction_mode", "grpo_lightning.algorithm.corrections.select:CORRECTION_MODES"),
    ("algorithm.truncated_sampling", "grpo_lightning.algorithm.truncation:TRUNCATED_SAMPLING"),
    ("algorithm.lr_schedule", "grpo_lightning.algorithm.lr_schedule:LR_SCHEDULES"),
)


def _builtin(names) -> list[str]:
    """The names a registry holds from the package itself (not from a plug-in a test loaded),
    sorted (registration order follows import order; messages sort them anyway)."""
    if not isinstance(names, Registry):
        return list(names)
    return sorted(n for n in names if names.origin(n).startswith("grpo_lightning."))


def index() -> dict[str, dict]:
    """field -> {"where": "module:attribute", "kind": registry kind or None, "names": [...]}."""
    for module in ("grpo_lightning.tasks", "grpo_lightning.rollout"):  # the tasks, the rewards, the engines
        importlib.import_module(module)
    out = {}
    for field, where in SOURCES:
        module, _, attribute = where.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        kind = found.kind if isinstance(found, Registry) else None
        out[field] = {"where": where, "kind": kind, "names": _builtin(found)}
    return out


def render() -> str:
    return json.dumps(index(), indent=1) + "\n"


if __name__ == "__main__":
    INDEX_FILE.write_text(render())
    sys.stdout.write(f"wrote {INDEX_FILE}\n")
