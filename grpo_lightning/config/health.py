"""``health.*``: the health monitor and one node per registered check (``health.<check>.*``).

Why the registry of checks lives here and not in ``grpo_lightning/health``: the schema layer
imports nothing above it, yet the ``health`` group's schema is built from the checks. So this
lowest layer owns the (empty) :data:`HEALTH_CHECKS` registry and the options every check shares
(:class:`CheckConfig`); each check file in ``grpo_lightning/health/`` (or a user's plug-in file)
registers its class with its own options dataclass into it, and :class:`HealthConfig` names
``grpo_lightning.health`` as the module that registers the built-in checks, loaded by name
through the plug-in mechanism (config/nodes.py) like any user's file.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.config.base import Schema, check, choice, option
from grpo_lightning.config.nodes import PluginNodes
from grpo_lightning.registry import Registry

HEALTH_ACTIONS = ("warn", "raise", "ignore")
HEALTH_CHECKS: Registry[type] = Registry("health check", "health")
_ACTION_HELP = (
    "What an alert does: warn (warning + health/alert/<check> metric), raise (stop with the diagnosis), ignore."
)
PATIENCE_HELP = "Consecutive suspicious steps before the alert fires."


@dataclass
class CheckConfig(Schema):
    """What every check has: an action and a patience."""

    action: str = option("warn", _ACTION_HELP)
    patience: int = option(2, PATIENCE_HELP)

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}action", self.action, HEALTH_ACTIONS)
        check(problems, self.patience >= 1, f"{p}patience={self.patience} must be >= 1")
        return problems


@dataclass
class HealthConfig(PluginNodes):
    """The monitor's own fields, plus ``health.<check>`` for every registered check."""

    node_registries = (HEALTH_CHECKS,)
    builtin_modules = ("grpo_lightning.health",)

    enabled: bool = option(True, "Attach the HealthMonitor callback (grpo_lightning.callbacks.HealthMonitor).")
    log_every_n_steps: int = option(1, "Log health/* metrics every n steps (checks and alerts run every step).")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.log_every_n_steps >= 1, f"{p}log_every_n_steps={self.log_every_n_steps} must be >= 1")
        return problems
