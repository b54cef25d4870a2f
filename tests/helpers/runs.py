"""A short run built from a config and fitted as the CLI fits it (``build.fit``: resume included)."""

from __future__ import annotations

import warnings

from grpo_lightning.build import build_run, fit


def train(cfg, *callbacks):
    """``build_run(cfg)`` plus ``callbacks``, fitted without a progress bar; returns (run, trainer)."""
    run = build_run(cfg)
    run.callbacks.extend(callbacks)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(run, trainer, cfg)
    return run, trainer
