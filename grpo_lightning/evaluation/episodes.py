"""Held-out episodes: the validation rows of an episode task played in its environment (``val/*``).

Why: the training reward of an episode task is measured on the games the policy trains on, with
seeds that change every step; "did the policy get better?" needs the same held-out games before
and after. Every row's reset seed and the sampling seed of each of its ``eval.samples_per_row``
episodes come from the row's content alone (not the step, the rank or the run's seed), so every
evaluation of a run, and of any run on the same rows, plays the same games with the same random
streams. The episodes are played by the training rollout's own runner pieces (engine, chat
renderer, environment factory, limits, tool-call parser) and scored by the task's rewards, as a
training batch is.

Metrics (means over the held-out episodes): ``val/reward`` (the weighted sum of ``task.rewards``),
``val/success`` (the environment's ``info[task.success_info]``, or ``task.success_reward`` >= 1),
``val/turns``, ``val/tool_calls``, ``val/stop/<reason>`` (shares), and ``val/pass@k`` (a row with
any success among its k episodes) when k > 1.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from grpo_lightning.environments.episode import Episode, EpisodeRunner
from grpo_lightning.environments.limits import STOP_REASONS
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.rollout import Sampling

if TYPE_CHECKING:
    from grpo_lightning.rollout.generator import RolloutGenerator

CORRECT = 1.0 - 1e-6  # a success reward at least this high counts as success


def row_seed(row: dict[str, Any], sample: int) -> int:
    """A 63-bit seed of a held-out row (``sample`` -1: its reset seed; 0..k-1: its episodes' sampling seeds)."""
    key = json.dumps(row, sort_keys=True, default=str).encode()
    digest = hashlib.blake2b(key + struct.pack("<q", sample), digest_size=8, person=b"grpo-val-ep").digest()
    return int.from_bytes(digest, "little") >> 1


class EpisodeEvaluator:
    """``evaluate(rows)`` -> ``val/*`` of the rows' held-out episodes (the module's ``evaluator`` for episode tasks)."""

    correctness_reward = None  # what the health checks read of an evaluator: success is the episodes' own

    def __init__(
        self,
        rollout: RolloutGenerator,
        greedy: bool = True,
        samples_per_row: int = 1,
        max_new_tokens: int | None = None,
        success_info: str = "success",
        success_reward: str | None = None,
    ):
        self.rollout, self.samples, self.max_new_tokens = rollout, samples_per_row, max_new_tokens
        self.success_info, self.success_reward = success_info, success_reward
        budget = max_new_tokens or rollout.sampling.max_new_tokens
        # Greedy: the most likely token (top_k=1) at every step; else sampled as training samples.
        greedy_sampling = Sampling(max_new_tokens=budget, temperature=1.0, top_p=1.0, top_k=1)
        self.sampling = greedy_sampling if greedy else replace(rollout.sampling, max_new_tokens=budget)
        self.last_episodes: list[Episode] = []  # the latest evaluation's episodes, for reading and replay
        self._warned = self._warned_replaced = False

    def play(self, rows: list[dict]) -> tuple[list[dict], list[Episode]]:
        """``samples_per_row`` episodes of each row (row-major), with the rows' fixed seeds."""
        episodes = self.rollout.episodes
        if self.rollout.engine is None or episodes is None:
            raise RuntimeError("held-out episodes need the rollout's engine and episodes; evaluate inside Trainer.fit")
        k = self.samples
        expanded = [row for row in rows for _ in range(k)]
        resets = [row_seed(row, -1) for row in expanded]
        samples = [row_seed(row, j) for row in rows for j in range(k)]
        limits = episodes.limits
        if self.max_new_tokens is not None:
            limits = replace(limits, max_turn_tokens=self.max_new_tokens)
        runner = EpisodeRunner(
            self.rollout.engine,
            episodes.renderer,
            episodes.make_env,
            limits,
            self.sampling,
            episodes.parser,
            env_name=episodes.env_name,  # named in failures and errors, as in training
            images=episodes.images,
        )
        return expanded, runner.run(expanded, resets, samples)

    def evaluate(self, records: list[dict], step: int = 0, rank: int = 0) -> dict[str, float]:
        if not isinstance(self.rollout.episodes, EpisodeRollout):  # replaced, e.g. by a VerifiersRollout
            if not self._warned_replaced:
                self._warned_replaced = True
                rank_zero_info(
                    f"held-out episodes: the rollout's episodes are a {type(self.rollout.episodes).__name__}, not the "
                    "runner's EpisodeRollout; no val/* for them"
                )
            return {}
        expanded, played = self.play(records)
        self.last_episodes = played
        total, components = self.rollout.episodes.score(
            self.rollout.scorer, expanded, played, [list(e.ids) for e in played], step
        )
        success = self.successes(played, components)
        return episode_val_metrics(played, total.tolist(), success, self.samples)

    def successes(self, played: list[Episode], components: dict) -> list[bool]:
        if self.success_reward is not None:
            return [bool(v >= CORRECT) for v in components[self.success_reward].tolist()]  # NaN: not a success
        if not self._warned and not any(self.success_info in e.info for e in played):
            self._warned = True
            rank_zero_warn(
                f"val/success counts the episodes whose environment info[{self.success_info!r}] is true, and none "
                f"of these {len(played)} held-out episodes reported it: set task.success_info to the key your "
                "environment's Step.info sets, or task.success_reward to a reward of task.rewards"
            )
        return [bool(e.info.get(self.success_info)) and not e.failed for e in played]


def episode_val_metrics(played: list[Episode], rewards: list[float], success: list[bool], k: int) -> dict[str, float]:
    """The ``val/*`` of held-out episodes laid out row-major, ``k`` per row (every key always present:
    the means are reduced over ranks key by key)."""
    n = max(len(played), 1)
    metrics = {
        "val/reward": sum(rewards) / n,
        "val/success": sum(success) / n,
        "val/turns": sum(e.num_turns for e in played) / n,
        "val/tool_calls": sum(e.tool_calls for e in played) / n,
    }
    for reason in STOP_REASONS:
        metrics[f"val/stop/{reason}"] = sum(e.stop_reason == reason for e in played) / n
    if k > 1:
        rows = [success[i : i + k] for i in range(0, len(success), k)]
        metrics[f"val/pass@{k}"] = sum(any(row) for row in rows) / max(len(rows), 1)
    return metrics
