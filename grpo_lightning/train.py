"""The Hydra entry point: ``grpo-lightning key=value ...``, or ``python -m grpo_lightning.train key=value ...``.

Thin on purpose: check the command line before any heavy import (config/early.py), compose and
type-check the config, validate it before transformers and Lightning are imported, apply
``trainer.huge_pages``, build the run (``build.build_run``), fit. Lightning is imported
only after the allocator choice (torch reads it at its first CPU allocation).
"""

from __future__ import annotations

import math
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from grpo_lightning.cli_errors import end_on_error, run_cli
from grpo_lightning.config import TrainConfig, validate_config
from grpo_lightning.config.compose import CONF_DIR, SCHEMA, finish, plan, run_dir_follows_output_dir
from grpo_lightning.config.early import early_check
from grpo_lightning.config_docs import cli_help
from grpo_lightning.runtime import process_exit
from grpo_lightning.runtime.logging_setup import HTTP_LOGGERS, quiet_http_logs
from grpo_lightning.runtime.run_lock import HydraCallbackRefused, release_all

_SCHEMA = SCHEMA  # the schema Hydra composes onto (grpo_lightning/config/compose.py says why)
__all__ = ["CONF_DIR", "HTTP_LOGGERS", "cli", "main", "quiet_http_logs", "run", "to_train_config"]

# Overrides held back from Hydra by phase 1 (dict assignments such as task.rewards={...}),
# applied by to_train_config on what Hydra composed (grpo_lightning/config/compose.py).
_DEFERRED: list = []
_EXPLICIT: set[str] = set()  # the keys the command line sets (a model's defaults leave them)


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as a typed ``TrainConfig``: held-back overrides applied, unknown
    keys refused (Hydra already type-checked the rest)."""
    return finish(cfg, _DEFERRED, _EXPLICIT)


class Interrupted(Exception):
    """The run stopped on SIGINT / SIGTERM after writing a checkpoint and the model."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def finish_logger(trainer) -> None:
    """Close a wandb run before the process exits: Lightning's WandbLogger leaves that to wandb's
    exit hook, which on a loaded machine could lose the last history row (the final evaluation)."""
    from lightning.pytorch.loggers import WandbLogger  # noqa: PLC0415  (lightning: after trainer.huge_pages)

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            logger.experiment.finish()


def run(cfg: TrainConfig, logged_config: dict | None = None) -> dict[str, float]:
    """Train with ``cfg`` (baseline evaluation, fit, final evaluation); returns the last logged metrics.

    Raises :class:`Interrupted` when a signal stopped the run (its checkpoint is written)."""
    validate_config(cfg)  # before transformers and Lightning are imported: a bad value answers at once
    from grpo_lightning.models.allocator import apply_huge_pages  # noqa: PLC0415  (transformers' models: after validation)

    apply_huge_pages(cfg.trainer.huge_pages)
    # Only now: importing lightning makes torch's first CPU allocation, which fixes the allocator.
    from grpo_lightning.build import build_run, fit  # noqa: PLC0415  (lightning: after trainer.huge_pages)

    built = build_run(cfg, logged_config=logged_config)
    trainer = built.trainer(cfg)
    try:
        fit(built, trainer, cfg)
    finally:
        built.module.rollout.shutdown()  # a launched vLLM server stops with the run
        finish_logger(trainer)
    if built.checkpoints is not None and built.checkpoints.interrupted is not None:
        raise Interrupted(built.checkpoints.interrupted)
    # The module and the health monitor write their step metrics to the loggers themselves.
    health = built.health.last_metrics if built.health is not None else {}
    logged = {k: float(v) for k, v in trainer.logged_metrics.items()}
    return {**built.module.last_metrics, **health, **logged}


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_http_logs()  # after Hydra configured logging (it may set these levels itself)
    try:
        train_cfg = to_train_config(cfg)
        metrics = run(train_cfg, logged_config=OmegaConf.to_container(cfg, resolve=True))
    except Interrupted as stop:
        sys.exit(128 + stop.signum)
    except Exception as err:  # the user's: one or two lines, exit 2; a bug: re-raised, with its traceback
        end_on_error(err)
        raise
    print(final_metrics_line(metrics))
    print_outputs(train_cfg.trainer.output_dir)


RUN_LEVEL = ("reward", "kl", "distill", "train", "val")  # a pure distillation run's signal is distill/kl


def final_metrics_line(metrics: dict[str, float]) -> str:
    """The console's last word on a run: its reward, kl, distillation, train and val metrics, each in
    four significant digits (rounding to decimals showed a learning rate of 2e-05 as 0.0)."""
    shown = ", ".join(f"{k!r}: {_significant(v)}" for k, v in metrics.items() if k.split("/")[0] in RUN_LEVEL)

    return f"final metrics: {{{shown}}}"


def _significant(value: float) -> str:
    """``value`` in four significant digits; a whole number as an integer (a count stays a count),
    and from 10^4 on one decimal (a rate of 123456.8 tokens/s, not 1.235e+05)."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1e4 else f"{value:.4g}"


def print_outputs(output_dir: str) -> None:
    """The last lines: where the report, summary, samples, model, checkpoint, metrics and log went."""
    from grpo_lightning.callbacks.run_report import saved_outputs  # noqa: PLC0415  (lightning is loaded by now)

    lines = saved_outputs(output_dir)
    if lines:
        print("outputs:\n" + "\n".join(lines))


def cli() -> None:
    """The console script: phase 1 of the composition (import ``plugins``, hold back dict
    assignments) on the command line, then Hydra composes and runs :func:`main`; errors end as
    :mod:`grpo_lightning.cli_errors` says (one or two lines and exit 2 for what the user can fix,
    a traceback for a bug). ``grpo-lightning help GROUP`` prints that group's keys with their help."""
    if sys.argv[1:2] == ["help"]:
        sys.exit(cli_help(sys.argv[2:]))
    if getattr(sys.modules.get("__main__"), "cli", None) is cli:  # the console script or python -m: our process
        process_exit.own_process()  # it ends, whatever threads user code leaves behind (process_exit.py)
    try:
        run_cli(_plan_then_main)
    except SystemExit as stop:
        process_exit.set_exit_code(stop.code)
        raise
    except BaseException:
        process_exit.set_exit_code(1)
        raise


def _plan_then_main() -> None:
    early_check(sys.argv[1:])  # no heavy import yet: a typo or a bad value answers in about a second
    steps = plan(sys.argv[1:])
    _DEFERRED[:] = steps.deferred
    _EXPLICIT.update(steps.explicit)
    sys.argv[1:] = run_dir_follows_output_dir(steps.hydra)
    try:
        main()
    except HydraCallbackRefused as refused:  # the run folder's lock, refused before Hydra wrote anything there
        raise refused.error from None
    finally:  # this command line's held-back overrides must not reach a later composition in the process
        _DEFERRED.clear()
        _EXPLICIT.clear()
        release_all()  # the lock Hydra's callback took, when the run failed before fit released it


if __name__ == "__main__":
    cli()
