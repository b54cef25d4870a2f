"""The start-up step estimate: it grows with every size of a step, and is said only when minutes."""

from __future__ import annotations

import random

from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.models.tiny import build_tiny_policy
from grpo_lightning.runtime.step_estimate import episode_step_seconds, estimate_line, time_forward


def test_the_estimate_grows_with_episodes_prompt_turns_and_budget():
    rng = random.Random(0)
    for _ in range(200):
        token_s, pass_s = rng.uniform(1e-5, 1e-2), rng.uniform(1e-3, 1.0)
        sizes = [rng.randint(1, 256), rng.randint(1, 800), rng.randint(1, 8), rng.randint(1, 128)]
        base = episode_step_seconds(token_s, pass_s, *sizes)
        for i in range(4):
            bigger = list(sizes)
            bigger[i] += rng.randint(1, 10)
            assert episode_step_seconds(token_s, pass_s, *bigger) > base
    # the default key_lookup batch on SmolLM2 (128 episodes of ~500 tokens) on 2 cores: minutes
    assert episode_step_seconds(2e-3, 0.1, 128, 300, 3, 64) / 60 > 10


def test_the_line_says_minutes_and_what_sizes_the_step_only_above_a_minute():
    assert estimate_line(59.0, 8, 100, 2, 48) is None
    line = estimate_line(25 * 60.0, 128, 300, 3, 64)
    assert "a step of 128 episodes" in line and "about 25 minutes" in line and "rollout.max_new_tokens" in line


def test_two_forward_passes_of_the_policy_are_timed():
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    policy.train()
    token_s, pass_s = time_forward(policy, len(tokenizer))
    assert 0 < token_s < pass_s * 10 and policy.training  # left as it was
