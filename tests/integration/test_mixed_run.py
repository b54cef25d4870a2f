"""A mixed run of two reasoning-gym datasets, a different reward each: per-source metrics and
evaluations while training, then grpo-lightning-eval on its hf/final and on its checkpoint."""

from __future__ import annotations

import string
import tempfile
import warnings
from dataclasses import replace

import pytest

from grpo_lightning.build import build_run, fit
from grpo_lightning.config.compose import compose
from grpo_lightning.eval_cli import evaluate
from grpo_lightning.runtime.checkpoints import checkpoints_in

pytest.importorskip("reasoning_gym")

OVERRIDES = [
    "task=mixed",
    "task.sources.sums.size=30",
    "task.sources.chains.size=30",
    "task.sources.chains.weight=3",
    "task.val_fraction=0.2",
    "rollout.prompts_per_step=4",
    "rollout.num_generations=2",
    "rollout.max_new_tokens=3",
    "eval.num_prompts=2",
    "eval.pass_k=2",
    "health.enabled=false",
    "logger=none",
]


def config(*extra: str):
    cfg, _ = compose([*OVERRIDES, *extra])
    # reasoning-gym's questions are English: the tiny tokenizer needs letters (no quoting on a command line).
    alphabet = string.ascii_letters + string.digits + string.punctuation + " \n"
    return replace(cfg, model=replace(cfg.model, tiny=replace(cfg.model.tiny, alphabet=alphabet)))


@pytest.mark.slow
def test_a_mixed_run_logs_and_evaluates_each_source_then_evaluates_alone(tmp_path, monkeypatch):
    cfg = config("trainer.max_steps=2", "trainer.checkpoint_every_n_steps=2", f"trainer.output_dir={tmp_path}")
    run = build_run(cfg)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(run, trainer, cfg)
    step = run.module.last_metrics
    for source, fn in (("sums", "reasoning_gym"), ("chains", "arithmetic_close")):
        assert f"reward/{source}/mean" in step and f"reward/{source}/{fn}/mean" in step
    assert "reward/sums/arithmetic_close/mean" not in step and "reward/chains/reasoning_gym/mean" not in step
    assert step["reward/sums/share"] + step["reward/chains/share"] == pytest.approx(1.0)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    for source in ("sums", "chains"):
        assert {f"val/{source}/accuracy", f"val/{source}/pass@2"} <= set(logged)
    assert logged["val/accuracy"] == pytest.approx((logged["val/sums/accuracy"] + logged["val/chains/accuracy"]) / 2)

    scratch = tmp_path / "temp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    from_export = evaluate(config("trainer.output_dir=.", f"eval.checkpoint={tmp_path / 'hf' / 'final'}"))
    from_ckpt = evaluate(config("trainer.output_dir=.", f"eval.checkpoint={checkpoints_in(tmp_path)[-1]}"))
    assert not list(scratch.glob("grpo-eval-*"))  # each evaluation's scratch folder is gone
    assert from_export["val/sums/prompts"] == from_export["val/chains/prompts"] == 2
    for key in ("val/accuracy", "val/sums/score", "val/chains/score", "val/chains/mean_length"):
        assert from_export[key] == pytest.approx(logged[key]) and from_ckpt[key] == pytest.approx(logged[key])
