"""Held-out evaluation: what the policy scores on prompts it never trains on (``val/*``).

``held_out.py`` is the single-turn evaluator (greedy accuracy and pass@k) that the module runs
every ``eval.every_n_steps`` and ``grpo-lightning-eval`` runs on a checkpoint.
"""

from grpo_lightning.evaluation.held_out import Evaluator

__all__ = ["Evaluator"]
