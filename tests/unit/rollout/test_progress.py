"""Long rollouts show a per-token progress bar; short ones stay quiet."""

from __future__ import annotations

from grpo_lightning.config import RolloutConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling


def test_rollout_progress_bar_only_for_long_generations(capsys):
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    requests = [GenerationRequest(tokenizer("1+2=")["input_ids"], seed) for seed in range(3)]
    engine = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, progress_min_tokens=6)
    engine.generate(requests, Sampling.from_config(RolloutConfig(max_new_tokens=4)))
    assert "rollout:" not in capsys.readouterr().err
    engine.generate(requests, Sampling.from_config(RolloutConfig(max_new_tokens=6)))
    assert "rollout: 3 sequences" in capsys.readouterr().err
