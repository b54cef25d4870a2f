"""Metrics that span ranks: torchmetrics objects, so DDP/FSDP reduce them with torchmetrics' own sync.

Why torchmetrics: a step's reward statistics, token counts and held-out accuracy are sums over
every rank's samples; a hand-written all-reduce per metric is easy to get wrong (a mean of
per-rank means is not the mean when ranks hold different counts). Each object keeps its state
as sums (or maxima) that add up exactly over ranks and micro-batches; ``compute()`` syncs them
(one all-gather per state, a no-op on one process) and every rank gets the same values.

:class:`StepStats` is reset every step (two states: sums and maxima); :class:`ValidationMeans`
is one ``MeanMetric`` per ``val/*`` key, weighted by prompts, reset after each validation.
"""

from __future__ import annotations

import math

import torch
from torchmetrics import MeanMetric, Metric

from grpo_lightning.algorithm import tied_groups
from grpo_lightning.records import PassStats, RolloutBatch

# Sums over the step's samples and tokens; per reward function three more (sum, sum of squares, count).
_SUMS = (
    "prompt_tokens",
    "completion_tokens",
    "sequences",
    "reward_sum",
    "group_std_sum",
    "groups",
    "tied_groups",
    "finished",
    "finished_tokens",
    "kept_tokens",
    "entropy_sum",
    "kl_sum",
    "clip_low_sum",
    "clip_high_sum",
)
# Maxima (a minimum is stored negated).
_MAXES = ("max_length", "neg_min_length", "max_terminated_length", "neg_min_terminated_length")


class StepStats(Metric):
    """One step's reward, length and token statistics over every rank (``update`` once per rank)."""

    full_state_update = False

    def __init__(self, reward_names: tuple[str, ...] = ()):
        super().__init__()
        self.reward_names = tuple(reward_names)
        width = len(_SUMS) + 3 * len(self.reward_names)
        self.add_state("sums", torch.zeros(width, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("maxes", torch.full((len(_MAXES),), -math.inf, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, rollout: RolloutBatch, last: PassStats) -> None:
        lengths = rollout.completion_mask.sum(dim=1).to(torch.float64)
        grouped = rollout.rewards.to(torch.float64).view(-1, rollout.group_size)
        group_std = grouped.std(dim=1) if rollout.group_size > 1 else torch.zeros(grouped.shape[0])
        finished = rollout.finished.to(lengths.device) if rollout.finished is not None else None
        done = lengths[finished] if finished is not None else lengths
        values = [
            rollout.prompt_mask.sum(),
            lengths.sum(),
            lengths.numel(),
            grouped.sum(),
            group_std.sum(),
            grouped.shape[0],
            tied_groups(rollout.rewards, rollout.group_size).sum(),
            done.numel(),
            done.sum(),
            last.kept_tokens,
            last.entropy_sum,
            last.kl_sum,
            last.clip_low_sum,
            last.clip_high_sum,
        ]
        for name in self.reward_names:
            scores = rollout.reward_components[name].to(torch.float64)
            applied = scores[~scores.isnan()]  # NaN: the function did not apply to the sample (TRL's None)
            values += [applied.sum(), applied.pow(2).sum(), applied.numel()]
        self.sums += _on(self.sums, values)  # stacked on the device: no host read per value
        empty = -math.inf
        extremes = [
            lengths.max() if lengths.numel() else empty,
            -lengths.min() if lengths.numel() else empty,
            done.max() if done.numel() else empty,
            -done.min() if done.numel() else empty,
        ]
        self.maxes = torch.maximum(self.maxes, _on(self.maxes, extremes))

    def compute(self) -> dict[str, float]:
        s = dict(zip(_SUMS, self.sums[: len(_SUMS)].tolist(), strict=True))
        m = dict(zip(_MAXES, self.maxes.tolist(), strict=True))
        tokens = max(s["kept_tokens"], 1.0)
        out = {
            "num_tokens_step": s["prompt_tokens"] + s["completion_tokens"],
            "reward/mean": s["reward_sum"] / max(s["sequences"], 1.0),
            "reward/std": s["group_std_sum"] / max(s["groups"], 1.0),
            "reward/frac_zero_std": s["tied_groups"] / max(s["groups"], 1.0),
            "policy/entropy": s["entropy_sum"] / tokens,
            "policy/clip_frac_low": s["clip_low_sum"] / tokens,
            "policy/clip_frac_high": s["clip_high_sum"] / tokens,
            "policy/clip_ratio": (s["clip_low_sum"] + s["clip_high_sum"]) / tokens,
            "kl/mean": s["kl_sum"] / tokens,
            "completions/mean_length": s["completion_tokens"] / max(s["sequences"], 1.0),
            "completions/min_length": _finite(-m["neg_min_length"]),
            "completions/max_length": _finite(m["max_length"]),
            "completions/clipped_ratio": 1.0 - s["finished"] / max(s["sequences"], 1.0),
            "completions/mean_terminated_length": s["finished_tokens"] / s["finished"] if s["finished"] else 0.0,
            "completions/min_terminated_length": _finite(-m["neg_min_terminated_length"]),
            "completions/max_terminated_length": _finite(m["max_terminated_length"]),
        }
        per_function = self.sums[len(_SUMS) :].view(-1, 3).tolist() if self.reward_names else []
        for name, (total, squares, count) in zip(self.reward_names, per_function, strict=True):
            mean = total / count if count else math.nan
            var = (squares - count * mean * mean) / (count - 1) if count > 1 else 0.0
            out[f"reward/{name}/mean"] = mean
            out[f"reward/{name}/std"] = math.sqrt(max(var, 0.0)) if count else math.nan
        return out


def _on(like: torch.Tensor, values: list) -> torch.Tensor:
    return torch.stack([torch.as_tensor(v, dtype=like.dtype).to(like.device) for v in values])


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


class ValidationMeans:
    """``val/*`` means weighted by prompts, exact over ranks and batches (one ``MeanMetric`` per key).

    Lightning validates under ``inference_mode`` before ``fit`` and under ``no_grad`` inside it;
    the states are kept out of inference mode so both may update them."""

    def __init__(self):
        self.means: dict[str, MeanMetric] = {}

    def update(
        self, metrics: dict[str, float], prompts: int, device: torch.device, weights: dict[str, float] | None = None
    ) -> None:
        """``weights``: the prompts a metric averages where it is not ``prompts`` (a group's own)."""
        weights = weights or {}
        with torch.inference_mode(False), torch.no_grad():
            for key, value in metrics.items():
                mean = self.means.setdefault(key, MeanMetric())
                weight = weights.get(key, prompts)
                mean.to(device).update(torch.tensor(value, dtype=torch.float32, device=device), weight=weight)

    def compute(self) -> dict[str, float]:
        """Every key's mean over all ranks (a collective: every rank calls it), then reset."""
        with torch.inference_mode(False), torch.no_grad():
            out = {key: float(mean.compute()) for key, mean in sorted(self.means.items())}
            for mean in self.means.values():
                mean.reset()
        return out
