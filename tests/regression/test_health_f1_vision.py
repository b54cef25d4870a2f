"""F1 on a vision-language policy, the failure this project was founded on: a VLM's multimodal rollouts
sampled every completion of a prompt's group from one seed, so the group held copies and the run went on
learning from duplicates. Reproduced with the tiny VLM on task=shapes (one sampling seed for the whole
group); the diversity check names it with its cause. The healthy run of the same settings raises no alert."""

from __future__ import annotations

from conftest import fit, make_config

import grpo_lightning.rollout.generator as rollout_module
from grpo_lightning.config import task_options
from grpo_lightning.config.effective import apply_model_defaults
from grpo_lightning.rollout.seeding import group_seeds


def vision_run_config(steps: int, prompts: int = 4):
    cfg = make_config(steps, **{"model.name_or_path": "tiny_vlm", "rollout.prompts_per_step": prompts})
    cfg.task = task_options("shapes", size=200)
    apply_model_defaults(cfg, explicit={"rollout.prompts_per_step"})  # this batch, not task=shapes' 64
    return cfg


def one_seed_per_group(run_seed, rank, step, num_prompts, num_generations):
    """The fault: each group's samples all drawn from its first sample's seed."""
    seeds = group_seeds(run_seed, rank, step, num_prompts, num_generations)
    return [seeds[i - i % num_generations] for i in range(len(seeds))]


def test_one_seed_for_a_multimodal_group_is_caught_and_named(monkeypatch):
    monkeypatch.setattr(rollout_module, "group_seeds", one_seed_per_group)
    run = fit(vision_run_config(4))
    alerts = run.health.alerts_for("diversity")
    assert alerts, f"no diversity alert; alerts: {[a.check for a in run.health.alerts]}"
    alert = alerts[0]
    assert alert.failure == "F1" and alert.step <= 2
    assert alert.values["identical_groups"] == alert.values["groups"] == 4
    assert "4 of 4 groups have all 8 completions identical" in alert.text
    assert "seed" in alert.causes and "SamplingParams(seed=request.seed)" in alert.fix
    prompts = run.module.last_step.rollout.prompts
    assert "<image:" in prompts[0], "the prompts the check compared carry their images"


def test_the_healthy_vision_run_raises_no_alert():
    """16 prompts: a random policy writes a question's answer first ~1% of the time (one of ~100 printable
    characters), so 4 prompts x 8 over F4's first 3 batches miss it ~38% of the time (F4, rightly)."""
    run = fit(vision_run_config(4, prompts=16))
    assert run.health.steps == 4
    assert [a.text for a in run.health.alerts] == []
