"""Resume with a changed config (issue 46, silent failure 6, and the resume items): every changed
field is applied and said, or refused; the model's shape is checked before the model loads; a
checkpoint that cannot be read is one line.

Before: a changed ``algorithm.lr`` was recorded (config, train.log) but the optimizer and schedule
state restored from the checkpoint kept the old one; another model shape failed after the model
loaded with a long traceback; so did a truncated checkpoint without its checksum file."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch

from grpo_lightning.build import build_run
from grpo_lightning.errors import CheckpointError
from grpo_lightning.runtime import checksums
from grpo_lightning.runtime.checkpoints import checkpoints_in
from tests.conftest import make_config
from tests.helpers.runs import train


def config(make_config, folder, steps, **overrides):
    return make_config(
        steps,
        **{
            "rollout.prompts_per_step": 2,
            "rollout.num_generations": 2,
            "rollout.max_new_tokens": 4,
            "trainer.checkpoint_every_n_steps": 2,
            "trainer.output_dir": str(folder),
            "eval.before_training": False,
            "algorithm.lr_schedule": "linear",  # the lr moves every step: the schedule's position must be kept
            **overrides,
        },
    )


class LearningRates(L.Callback):
    """The optimizer's learning rate at the start of every step."""

    def __init__(self):
        self.by_step: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.by_step[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


def rates_of(cfg) -> LearningRates:
    rates = LearningRates()
    train(cfg, rates)
    return rates


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """A run's folder with its step-2 checkpoint (lr 3e-4, linear decay over its 2 steps)."""
    folder = tmp_path_factory.mktemp("resume") / "run"
    train(config(make_config, folder, steps=2, **{"algorithm.lr": 3e-4}))
    return folder


def test_a_changed_lr_is_applied_on_resume_and_said(checkpointed, config_factory, tmp_path, capsys):
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    for path in (checkpointed / "checkpoints").iterdir():
        (folder / "checkpoints" / path.name).write_bytes(path.read_bytes())
    changed = {"algorithm.lr": 1e-3, "trainer.resume": "auto"}
    capsys.readouterr()
    resumed = rates_of(config(config_factory, folder, steps=4, **changed))
    said = capsys.readouterr().err
    fresh = rates_of(config(config_factory, tmp_path / "fresh", steps=4, **{"algorithm.lr": 1e-3}))
    assert sorted(resumed.by_step) == [2, 3]
    for step in (2, 3):  # the new lr, at the schedule's position: as a run with lr 1e-3 throughout
        assert resumed.by_step[step] == pytest.approx(fresh.by_step[step], rel=1e-6), step
    assert "with changed settings, applied from step 2: algorithm.lr: 0.0003 -> 0.001" in said, said
    assert "trainer.max_steps: 2 -> 4" in said
    state = torch.load(checkpoints_in(folder)[-1], weights_only=True)
    assert state["grpo_config"]["algorithm"]["lr"] == 1e-3  # the recorded config is what ran


def test_another_model_shape_is_refused_in_one_line_before_the_model_loads(checkpointed, config_factory):
    for allow in (False, True):  # no setting can load weights into another shape
        cfg = config(
            config_factory,
            checkpointed,
            steps=4,
            **{"model.tiny.hidden_size": 128, "trainer.resume": "auto", "trainer.resume_allow_changes": allow},
        )
        start = time.monotonic()
        with pytest.raises(CheckpointError) as refused:
            build_run(cfg)  # refused while building: before any model or weight loads
        message = str(refused.value)
        assert len(message.splitlines()) == 1 and time.monotonic() - start < 10
        assert "holds a model of another shape: model.tiny.hidden_size: 64 -> 128" in message


def test_a_truncated_checkpoint_without_its_checksum_is_one_line(checkpointed, config_factory, tmp_path):
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (source,) = checkpoints_in(checkpointed)[-1:]
    target = folder / "checkpoints" / source.name
    target.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    assert not checksums.sidecar(target).exists()  # an older run's, or a copy without its .sha256
    with pytest.raises(CheckpointError) as refused:
        build_run(config(config_factory, folder, steps=4, **{"trainer.resume": "auto"}))
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and f"checkpoint {target} cannot be read" in message, message
    assert "truncated or not a checkpoint" in message
