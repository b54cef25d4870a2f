"""Exact resume in process: the same completions and weights after a resume, the health
monitor's and NaN guard's memory restored, SIGTERM stops with a checkpoint, and resume errors."""

from __future__ import annotations

import os
import signal
import warnings

import lightning as L
import pytest

from grpo_lightning.build import build_run, fit
from grpo_lightning.config import ConfigError, validate_config
from grpo_lightning.runtime.checkpoints import checkpoints_in, resume_path


class Recorder(L.Callback):
    """Completions of every generation batch, by step."""

    def __init__(self):
        self.completions: dict[int, list[str]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.last_step.rollout
        self.completions[rollout.step] = list(rollout.completions)


def config(make_config, tmp_path, name, steps=6, **overrides):
    return make_config(
        steps,
        **{
            "rollout.prompts_per_step": 4,
            "rollout.num_generations": 4,
            "algorithm.micro_batch_size": 16,
            "trainer.checkpoint_every_n_steps": 3,
            "trainer.output_dir": str(tmp_path / name),
            "eval.before_training": False,
            "eval.num_prompts": 4,
            **overrides,
        },
    )


def train(cfg, *callbacks):
    run = build_run(cfg)
    recorder = Recorder()
    run.callbacks.extend([recorder, *callbacks])
    trainer = run.trainer(cfg, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", message=".*not resumable.*")  # Lightning's, about the prompt loader
        fit(run, trainer, cfg)
    return run, trainer, recorder


def test_resumed_run_generates_the_same_completions_and_weights(tmp_path, config_factory):
    straight, _, seen = train(config(config_factory, tmp_path, "a", **{"trainer.export_every_n_steps": 3}))
    assert sorted(p.name for p in (tmp_path / "a" / "hf").iterdir()) == ["final", "step_3", "step_6"]
    first = checkpoints_in(tmp_path / "a")[0]
    assert first.name == "step_00000003.ckpt"
    resumed, trainer, again = train(config(config_factory, tmp_path, "b", **{"trainer.resume": str(first)}))
    assert trainer.global_step == 6
    assert sorted(again.completions) == [3, 4, 5]  # generation steps after the checkpoint
    for step in (3, 4, 5):
        assert again.completions[step] == seen.completions[step]
    a, b = straight.module.policy.state_dict(), resumed.module.policy.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
    # the health monitor's memory came back: its reward-signal window holds all 6 steps
    windows = [
        len(r.health.checks[[c.name for c in r.health.checks].index("reward_signal")]._window)
        for r in (straight, resumed)
    ]
    assert windows == [6, 6]
    assert resumed.module.counters == straight.module.counters

    # the finished run asked for 2 more steps trains them (Lightning alone would stop at once)
    last = checkpoints_in(tmp_path / "a")[-1]
    assert last.name == "step_00000006.ckpt"
    more, trainer, later = train(config(config_factory, tmp_path, "a", 8, **{"trainer.resume": "auto"}))
    assert trainer.global_step == 8 and sorted(later.completions) == [6, 7]


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_the_model(tmp_path, capsys, config_factory):
    class Terminate(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    run, trainer, seen = train(config(config_factory, tmp_path, "t", 6), Terminate())
    assert run.checkpoints.interrupted == signal.SIGTERM
    assert trainer.global_step == 2 and sorted(seen.completions) == [0, 1]  # step 1 finished
    assert [p.name for p in checkpoints_in(tmp_path / "t")] == ["step_00000002.ckpt"]
    assert (tmp_path / "t" / "hf" / "step_2" / "model.safetensors").exists()
    assert not (tmp_path / "t" / "hf" / "final").exists()
    err = capsys.readouterr().err
    assert "stopped by SIGTERM after step 2" in err and "step_00000002.ckpt" in err and "trainer.resume=auto" in err
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored


def test_resume_auto_ignores_partial_writes_and_starts_fresh_without_checkpoints(tmp_path, capsys):
    assert resume_path("auto", tmp_path) is None
    assert "no checkpoint under" in capsys.readouterr().err
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "step_00000004.ckpt").write_bytes(b"x")
    (folder / ".step_00000008.ckpt.tmp").write_bytes(b"partial")  # killed mid-write
    assert resume_path("auto", tmp_path) == folder / "step_00000004.ckpt"


def test_resume_from_a_missing_file_is_rejected_before_any_model_loads(tmp_path, config_factory):
    cfg = config(config_factory, tmp_path, "m", **{"trainer.resume": str(tmp_path / "nope.ckpt")})
    with pytest.raises(
        ConfigError, match=r"trainer.resume=.*nope.ckpt': no such checkpoint file; give a .ckpt path, auto"
    ):
        validate_config(cfg)
