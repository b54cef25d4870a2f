"""Held-out evaluation: greedy accuracy and pass@k, with the rollout's own engine and prompts.

Why: the training reward mixes format, length and correctness and is measured on prompts
the policy trains on; ``val/accuracy`` answers the question users ask ("did the policy get
better?") on prompts it never trained on. The evaluator borrows the rollout callback's
engine and prompt formatter (the module's :class:`RolloutGenerator`), so evaluation sees
exactly what training sees (and follows whichever engine, HF or vLLM, the run uses).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rewards.columns import repeat_columns
from grpo_lightning.rewards.routing import SOURCE_COLUMN, SourceRouter
from grpo_lightning.rewards.scorer import as_reward_completions
from grpo_lightning.rollout import GenerationRequest, Sampling
from grpo_lightning.rollout.seeding import group_seeds

if TYPE_CHECKING:
    from grpo_lightning.rollout.generator import RolloutGenerator

CORRECT = 1.0 - 1e-6  # a correctness score at least this high counts as correct
_EVAL_STEP_OFFSET = -(1 << 40)  # eval seeds live apart from training steps (which are >= 0)


class Evaluator:
    """``evaluate(records)`` -> ``{"val/accuracy": ..., "val/pass@k": ..., "val/mean_length": ...}``, and
    the same per source (``val/<source>/accuracy``, ...) for records with a ``data_source``, and per
    value of ``group_column`` (``val/<value>/accuracy``: a question type, a difficulty).

    ``groups``: every value of ``group_column`` among the held-out records; each batch reports each of
    them (weight 0 where the batch has none), so every rank logs the same keys."""

    def __init__(
        self,
        rollout: RolloutGenerator,
        correctness_reward: str,
        max_new_tokens: int,
        pass_k: int = 0,
        seed: int = 0,
        group_column: str | None = None,
        groups: list[str] | None = None,
    ):
        self.rollout = rollout
        self.group_column = group_column
        self.groups = list(groups or [])
        self.last_weights: dict[str, float] = {}  # metric -> prompts it averages (group metrics), for ValidationMeans
        # A mixed run's sources each judge their own rows (``correctness_reward`` is then source_correctness).
        if isinstance(rollout.scorer, SourceRouter):
            self.scorer = rollout.scorer.for_correctness()
        else:
            training = {r.name: r.fn for r in rollout.scorer.rewards}  # the same function, looked up once
            self.scorer = RewardScorer.from_names(
                {correctness_reward: 1.0}, modules=rollout.scorer.modules, functions=training
            )
        self.correctness_reward = correctness_reward
        # Greedy: the most likely token (top_k=1) at every step; pass@k samples as training does.
        self.greedy = Sampling(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, top_k=1)
        self.sampled = replace(rollout.sampling, max_new_tokens=max_new_tokens)
        self.pass_k = pass_k
        self.seed = seed
        self.last_samples: list[dict] = []  # prompt, completion, answer, correct (greedy), for notebooks

    def _scores(self, records: list[dict], per_record: int, sampling: Sampling, step: int, rank: int):
        seeds = group_seeds(self.seed, rank, _EVAL_STEP_OFFSET + step, len(records), per_record)
        expanded = [record for record in records for _ in range(per_record)]
        inputs = [self.rollout.prompt_inputs(r) for r in expanded]  # ids, and a VLM's images
        requests = [GenerationRequest(ids, seed, vision) for (ids, vision), seed in zip(inputs, seeds, strict=True)]
        completions = self.rollout.engine.generate(requests, sampling)
        texts = self.rollout.tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
        fields = repeat_columns(records, per_record)
        prompts = [r["prompt"] for r in expanded]
        _, parts = self.scorer(prompts, as_reward_completions(prompts, texts), fields)
        lengths = [len(c.token_ids) for c in completions]
        return parts[self.correctness_reward].view(len(records), per_record), texts, lengths

    def evaluate(self, records: list[dict], step: int = 0, rank: int = 0) -> dict[str, float]:
        if self.rollout.engine is None:
            raise RuntimeError("the rollout generator has no engine yet; evaluate inside Trainer.fit/validate")
        scores, texts, lengths = self._scores(records, 1, self.greedy, step, rank)
        correct = scores[:, 0] >= CORRECT
        self.last_samples = [
            {"prompt": r["prompt"], "completion": t, "answer": r.get("answer"), "correct": bool(c)}
            for r, t, c in zip(records, texts, correct.tolist(), strict=True)
        ]
        sampled = self._scores(records, self.pass_k, self.sampled, step, rank)[0] if self.pass_k > 0 else None
        greedy, length = scores[:, 0], torch.tensor(lengths, dtype=torch.float64)
        metrics = self._metrics("val/", torch.ones(len(records), dtype=torch.bool), greedy, length, sampled)
        sources = [r.get(SOURCE_COLUMN) for r in records]
        for source in dict.fromkeys(s for s in sources if s is not None):
            rows = torch.tensor([s == source for s in sources])
            metrics.update(self._metrics(f"val/{source}/", rows, greedy, length, sampled))
        self.last_weights = {}
        if self.group_column is not None:
            values = [str(r[self.group_column]) for r in records]
            for value in dict.fromkeys([*self.groups, *values]):
                rows = torch.tensor([v == value for v in values])
                count = int(rows.sum())
                group = self._metrics(f"val/{value}/", rows, greedy, length, sampled)
                if not count:  # none in this batch: the keys (their means of nothing are NaN), weighing nothing
                    group = dict.fromkeys(group, 0.0)
                metrics.update(group)
                self.last_weights.update(dict.fromkeys(group, float(count)))
        return metrics

    def _metrics(self, prefix: str, rows, greedy, lengths, sampled) -> dict[str, float]:
        """accuracy, score, mean_length and pass@k of the records ``rows`` selects."""
        metrics = {
            f"{prefix}accuracy": float((greedy[rows] >= CORRECT).float().mean()),
            f"{prefix}score": float(greedy[rows].mean()),
            f"{prefix}mean_length": float(lengths[rows].mean()),
        }
        if sampled is not None:
            metrics[f"{prefix}pass@{self.pass_k}"] = float((sampled[rows] >= CORRECT).any(dim=1).float().mean())
        return metrics


def group_values(records: list[dict], column: str | None) -> list[str]:
    """The values of ``column`` among the held-out ``records``, in order of first appearance; a record
    without the column stops the run, naming the row (``task.group_column``)."""
    if column is None:
        return []
    for i, record in enumerate(records):
        if column not in record:
            raise ConfigError(
                f"task.group_column={column!r}: held-out row {i} has no column {column!r} (its columns: "
                f"{', '.join(sorted(record))}); name one of them, or set task.group_column=null"
            )
    return list(dict.fromkeys(str(r[column]) for r in records))
