"""A health check of your own: what it measures, when it alerts, and what to try, in one file.

    grpo-lightning plugins=[examples/plugins/long_completions_check.py] health.long_completions.max_mean_tokens=6


A check returns *local sums* from ``measure``; the monitor adds them up over all ranks, so every
rank evaluates the same totals and reaches the same verdict. Its options (action, patience and
its own thresholds) become ``health.<name>.*``.
"""

from dataclasses import dataclass

from grpo_lightning.config import CheckConfig
from grpo_lightning.config.base import option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, register_check


@dataclass
class LongCompletionsOptions(CheckConfig):
    patience: int = option(1, "Steps in a row before the alert.")
    max_mean_tokens: float = option(1000.0, "Alert when completions average more tokens than this.")


@register_check(LongCompletionsOptions)
class LongCompletionsCheck(HealthCheck):
    name = "long_completions"  # the config key (health.long_completions) and the metrics' namespace
    failure = "U1"
    title = "completions longer than expected"

    def measure(self, view):
        lengths = view.rollout.completion_mask.sum(dim=1)
        return {"tokens": float(lengths.sum()), "completions": float(lengths.numel())}

    def evaluate(self, totals, view):
        mean = totals["tokens"] / max(totals["completions"], 1.0)
        metrics = {"mean_tokens": mean}
        if mean <= self.cfg.max_mean_tokens:
            return metrics, None
        return metrics, Finding(f"completions average {mean:.1f} tokens > {self.cfg.max_mean_tokens}", metrics)

    def diagnosis(self, view):
        return (
            "the policy writes more than the task needs (a length-blind reward?)",
            "add the length_penalty reward (task.max_completion_chars) or lower rollout.max_new_tokens",
        )
