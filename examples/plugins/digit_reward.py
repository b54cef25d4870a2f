"""A reward of your own: one function, registered by name, in one file.

    grpo-lightning plugins=[examples/plugins/digit_reward.py] 'task.rewards={digits_only: 1.0}'

The calling convention is TRL's: the prompts, the completions (strings, or chat messages when the
prompts were messages) and every other column of the dataset record as keyword arguments; one
float per completion, or None where the reward does not apply.
"""

from grpo_lightning.rewards import register_reward


@register_reward("digits_only")
def digits_only(prompts, completions, **kwargs):
    """1 when the completion is a non-empty run of digits (an answer, nothing else), else 0."""
    return [1.0 if c.strip().isdigit() else 0.0 for c in completions]
