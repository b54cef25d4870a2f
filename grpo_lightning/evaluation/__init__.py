"""Held-out evaluation: what the policy scores on prompts it never trains on (``val/*``).

``held_out.py`` is the single-turn evaluator (greedy accuracy and pass@k), ``episodes.py`` the one of
episode tasks (the held-out rows played in the environment with fixed seeds: val/reward,
val/success, ...); the module runs one every ``eval.every_n_steps`` and ``grpo-lightning-eval`` runs
it on a checkpoint.
"""

from grpo_lightning.evaluation.episodes import EpisodeEvaluator
from grpo_lightning.evaluation.held_out import Evaluator

__all__ = ["EpisodeEvaluator", "Evaluator"]
