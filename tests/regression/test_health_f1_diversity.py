"""F1: identical completions. A rollout engine that reuses one seed, a sampler made greedy and
seeds that ignore the step are each caught by the diversity check; the healthy twin is not."""

from __future__ import annotations

import hashlib

import torch
from conftest import fit, make_config

import grpo_lightning.rollout.generator as rollout_module
from grpo_lightning.rollout import GenerationRequest, HFEngine
from grpo_lightning.rollout import sampler as sampler_module

STEPS = 12


def _one_seed(run_seed, rank, step, num_prompts, num_generations):
    """The F1 bug: every request sampled with the same fixed seed."""
    return [1234] * (num_prompts * num_generations)


def _content_seeded(monkeypatch):
    """An engine that seeds each request from its content (prompt, sample index) and ignores
    the seed it was given: the samples of a group differ, but a prompt gets the same
    completions at every step."""
    original = HFEngine.generate

    def generate(self, requests, sampling):
        group = 8
        reseeded = [
            GenerationRequest(
                r.prompt_ids, int.from_bytes(hashlib.blake2b(bytes(r.prompt_ids + [i % group])).digest()[:7], "little")
            )
            for i, r in enumerate(requests)
        ]
        return original(self, reseeded, sampling)

    monkeypatch.setattr(HFEngine, "generate", generate)


def test_engine_reusing_one_seed_is_diagnosed_as_f1(monkeypatch):
    monkeypatch.setattr(rollout_module, "group_seeds", _one_seed)
    run = fit(make_config(STEPS))
    alerts = run.health.alerts_for("diversity")
    assert alerts, f"no diversity alert; alerts: {[a.check for a in run.health.alerts]}"
    alert = alerts[0]
    assert alert.failure == "F1"
    assert alert.step <= 2  # patience 2: caught at once
    assert alert.values["identical_groups"] == alert.values["groups"] == 16
    assert "16 of 16 groups have all 8 completions identical" in alert.text
    assert "seed" in alert.causes and "SamplingParams(seed=request.seed)" in alert.fix


def test_greedy_sampler_is_diagnosed_as_f1(monkeypatch):
    original = sampler_module.SeededSampler.draw

    def greedy_draw(self, logits):
        _, _ = original(self, logits)  # advance the streams as usual, then ignore them
        z = sampler_module.filter_logits(logits, self.sampling)
        tokens = z.argmax(dim=-1)
        return tokens, torch.log_softmax(z, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)

    monkeypatch.setattr(sampler_module.SeededSampler, "draw", greedy_draw)
    run = fit(make_config(STEPS))
    alerts = run.health.alerts_for("diversity")
    assert alerts and alerts[0].failure == "F1"
    assert alerts[0].values["duplicate_frac"] > 0.9
    assert alerts[0].values["duplicate_expected_frac"] < 0.3  # the policy itself is far from greedy


def test_engine_seeding_from_the_prompt_is_caught_by_cross_step_repeats(monkeypatch):
    _content_seeded(monkeypatch)
    run = fit(make_config(20))
    alerts = run.health.alerts_for("diversity")
    assert alerts, "the same prompt gave the same completions at every step, unnoticed"
    values = alerts[0].values
    assert values["repeat_obs"] > 3 * values["repeat_exp"]
    assert values["identical_groups"] < values["groups"]  # within a step the samples do differ
    assert "repeat a completion of that step" in alerts[0].evidence


def test_healthy_twin_has_no_diversity_alert():
    run = fit(make_config(20))
    assert run.health.alerts_for("diversity") == []
    metrics = run.health.last_metrics
    assert metrics["health/diversity/distinct_per_group"] > 2
    assert metrics["health/alert/diversity"] == 0.0
