"""Shared helpers: build and fit the default task with a few overrides, one thread, no logger."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_lightning.build import Run, build_run
from grpo_lightning.config import TrainConfig

torch.set_num_threads(1)


def make_config(steps: int, seed: int = 0, **overrides) -> TrainConfig:
    """The default config with ``max_steps``, ``seed`` and dotted overrides ("algorithm.beta": 0.0)."""
    cfg = TrainConfig()
    cfg.trainer.max_steps = steps
    cfg.trainer.seed = seed
    cfg.logger.kind = "none"
    for dotted, value in overrides.items():
        *path, last = dotted.split(".")
        node = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


def fit(cfg: TrainConfig, prepare=None) -> Run:
    """Build the run, let ``prepare(run)`` inject a fault, fit; the run keeps its HealthMonitor."""
    run = build_run(cfg)
    if prepare is not None:
        prepare(run)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    run.fitted = trainer
    return run


@pytest.fixture
def config_factory():
    return make_config
