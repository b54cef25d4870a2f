"""DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), in tokens.

With ``L_max = rollout.max_new_tokens`` and a buffer of ``L_cache =
task.overlong_buffer_tokens`` tokens, a completion of ``|y|`` tokens gets

    0                                   if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max

so the penalty grows linearly from 0 to -1 over the last ``L_cache`` tokens of the budget
(a completion longer than ``L_max`` would get -1; the engine never produces one). Lengths
are the sampled completion tokens (``completion_ids``, EOS included), and the rollout passes
the budget as ``max_new_tokens``; characters would punish a tokenizer's long tokens
differently from its short ones.
"""

from __future__ import annotations

import math

from grpo_lightning.rewards.registry import register_reward


def overlong_penalty_value(length: int, max_tokens: int, buffer: int) -> float:
    """DAPO's R_length for one completion of ``length`` tokens (see the module docstring)."""
    if buffer <= 0:
        raise ValueError(f"overlong_penalty needs task.overlong_buffer_tokens >= 1, got {buffer}")
    start = max_tokens - buffer
    if length <= start:
        return 0.0
    if length <= max_tokens:
        return (start - length) / buffer
    return -1.0


@register_reward("overlong_penalty")
def overlong_penalty(
    prompts: list[str],
    completions: list[str],
    completion_ids: list[list[int]] | None = None,
    max_new_tokens: list[int] | None = None,
    overlong_buffer_tokens: list[int] | None = None,
    **_,
) -> list[float]:
    """DAPO's soft overlong punishment in tokens: 0 up to ``max_new_tokens - buffer``, then
    linearly down to -1 at ``max_new_tokens`` (buffer: the record field
    ``overlong_buffer_tokens``, from task.overlong_buffer_tokens; without it a fifth of the budget)."""
    if completion_ids is None or max_new_tokens is None:
        raise ValueError("overlong_penalty needs the completion lengths in tokens: score it through RolloutGenerator")
    buffers = overlong_buffer_tokens or [0] * len(completions)
    return [
        overlong_penalty_value(len(ids), int(m), int(b) if b else default_buffer(int(m)))
        for ids, m, b in zip(completion_ids, max_new_tokens, buffers, strict=True)
    ]


def default_buffer(max_tokens: int) -> int:
    """The buffer when task.overlong_buffer_tokens is 0: a fifth of the budget (DAPO's 4096 of
    20480 tokens), at least one token."""
    return max(1, math.ceil(max_tokens / 5))
