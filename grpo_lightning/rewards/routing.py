"""Mixed-task runs: each sample is scored by the rewards of its own source (``data_source``).

A run that mixes datasets must not score one dataset's completions with another's rewards,
and an aggregate reward hides a source that gets worse. :class:`SourceRouter` has the
scorer's calling convention (:class:`~grpo_lightning.rewards.scorer.RewardScorer`): it splits
the samples by their ``data_source`` column, scores each share with that source's scorer and
puts the totals back in place. A component (``reward/<fn>/mean``) is NaN on the samples of
sources that do not use its function, as for a function that returns None.
:func:`source_reward_metrics` gives ``reward/<source>/mean`` and
``reward/<source>/<fn>/mean`` from a batch's ``sources``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from grpo_lightning.data.mixture import SOURCE_COLUMN
from grpo_lightning.errors import RewardError
from grpo_lightning.rewards.lookup import find_reward
from grpo_lightning.rewards.reward_logs import RewardLogs
from grpo_lightning.rewards.scorer import RewardScorer, WeightedReward

CORRECTNESS = "source_correctness"  # the component holding each sample's own source's correctness


class SourceRouter:
    """``sources``: source name -> its scorer; ``correctness``: source -> the reward whose 1
    means correct there (None: the source has none). The per-sample correctness of each
    sample's source is also returned as the component :data:`CORRECTNESS`."""

    def __init__(
        self,
        sources: dict[str, RewardScorer],
        correctness: dict[str, str | None] | None = None,
        modules: Sequence[str] = (),
    ):
        if not sources:
            raise ValueError("a SourceRouter needs at least one source")
        self.sources = sources
        self.correctness = correctness or {}
        self.modules = tuple(modules)  # where reward names are looked up (task.reward_modules, plugins)
        self.last_logs = RewardLogs(0)  # what the sources' functions logged in the last batch, all rows

    @property
    def rewards(self) -> list[WeightedReward]:
        """Every source's rewards, each function once (its first source's weight): what the
        health checks read as ``task.rewards``."""
        seen: dict[str, WeightedReward] = {}
        for scorer in self.sources.values():
            for reward in scorer.rewards:
                seen.setdefault(reward.name, reward)
        return list(seen.values())

    def for_correctness(self) -> SourceRouter:
        """A router that scores only each source's correctness reward (for the evaluator)."""
        judged = {s: name for s, name in self.correctness.items() if name is not None}
        if not judged:
            raise ValueError("no source names a correctness_reward: there is nothing to evaluate")
        return SourceRouter({s: self._judge(s, name) for s, name in judged.items()}, judged, self.modules)

    def _judge(self, source: str, name: str) -> RewardScorer:
        """The source's own function when it is one of its rewards (its timeout kept), else the registered one."""
        fn = next((r.fn for r in self.sources[source].rewards if r.name == name), None)
        return RewardScorer([WeightedReward(name, fn or find_reward(name, self.modules))], self.modules)

    def __call__(
        self, prompts: list, completions: list, sample_fields: dict[str, list], **extra: Any
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = len(prompts)
        labels = sample_fields.get(SOURCE_COLUMN) or [None] * n
        unknown = sorted({str(s) for s in labels if s not in self.sources})
        if unknown:
            raise RewardError(
                f"rows with {SOURCE_COLUMN}={unknown} have no rewards: the sources are {sorted(self.sources)}; "
                f"name each row's source in task.sources (task=mixed)"
            )
        total = torch.zeros(n, dtype=torch.float32)
        # Every function's component in every batch (NaN where it scored nothing): stable keys for the loggers.
        components = {reward.name: torch.full((n,), math.nan) for reward in self.rewards}
        correct = torch.full((n,), math.nan)
        self.last_logs = RewardLogs(n)
        for source, scorer in self.sources.items():
            rows = [i for i, s in enumerate(labels) if s == source]
            if not rows:
                continue

            def pick(values: list, rows=rows) -> list:
                return [values[i] for i in rows]

            share_fields = {k: pick(v) for k, v in sample_fields.items()}
            share_extra = {k: pick(v) if isinstance(v, list) and len(v) == n else v for k, v in extra.items()}
            share_total, parts = scorer(pick(prompts), pick(completions), share_fields, **share_extra)
            index = torch.tensor(rows)
            total[index] = share_total
            for name, values in parts.items():
                components[name][index] = values
            self.last_logs.merge(scorer.last_logs, rows)
            judge = self.correctness.get(source)
            if judge is not None and judge in parts:
                correct[index] = parts[judge]
        if any(self.correctness.values()):
            components[CORRECTNESS] = correct
        return total, components


def source_reward_metrics(
    sources: list[str], rewards: torch.Tensor, components: dict[str, torch.Tensor]
) -> dict[str, float]:
    """``reward/<source>/mean``, ``reward/<source>/std``, ``reward/<source>/share`` (its share of the
    samples) and ``reward/<source>/<fn>/mean`` for every function that scored that source."""
    if not sources:
        return {}
    metrics: dict[str, float] = {}
    for source in sorted(set(sources)):
        rows = torch.tensor([s == source for s in sources])
        mine = rewards[rows].double()
        metrics[f"reward/{source}/mean"] = float(mine.mean())
        metrics[f"reward/{source}/std"] = float(mine.std()) if mine.numel() > 1 else 0.0
        metrics[f"reward/{source}/share"] = float(rows.double().mean())
        for name, values in components.items():
            scored = values[rows]
            if name != CORRECTNESS and not bool(torch.isnan(scored).all()):
                metrics[f"reward/{source}/{name}/mean"] = float(scored.nanmean())
    return metrics
