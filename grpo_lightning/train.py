"""The Hydra entry point: ``grpo-lightning key=value ...``, or ``python -m grpo_lightning.train key=value ...``.

Thin on purpose: compose and type-check the config, apply ``trainer.huge_pages``, validate the
config before any model loads, build the run (``build.build_run``), fit. Lightning is imported
only after the allocator choice (torch reads it at its first CPU allocation).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from grpo_lightning.cli_errors import end_on_error, run_cli
from grpo_lightning.config import ConfigError, TaskConfig, TrainConfig
from grpo_lightning.models.allocator import apply_huge_pages

# config.ConfigError is not yet an errors.UserError (the config/ package makes it one; then drop this).
USER_ERRORS = (ConfigError,)

# The configs ship inside the package (grpo_lightning/conf), so an installed wheel has them too.
CONF_DIR = Path(__file__).resolve().parent / "conf"

# The schema Hydra composes onto: the dataclass defaults, except that task.rewards is empty and
# every conf/task/*.yaml names its own rewards. This is still needed:
# - Hydra merges dicts key-wise and a config file cannot replace or delete one (Hydra issue
#   #1896): a task file's rewards merged onto the arithmetic default would keep the arithmetic
#   rewards too, a `???` value merged onto a dict is skipped, and `~task.rewards` is a
#   command-line override that a schema field refuses ("does not support deletion").
# - TaskConfig keeps the arithmetic rewards as its default because TrainConfig() in Python is the
#   arithmetic task and must run as it is (README, notebook). Filling an empty default from the
#   task instead would hide the rewards from --cfg job and the logged config, or list every
#   task's rewards twice (in code and in its YAML file).
# So conf/task/arithmetic.yaml names the same rewards as TaskConfig's default (tests/test_config.py
# checks that the composed default equals TrainConfig()), and CLI overrides keep merging key-wise:
# task.rewards.x=w changes a weight, +task.rewards.x=w or +task.rewards={x:w} adds one,
# ~task.rewards.x removes one (tests/test_tasks.py).
_SCHEMA = TrainConfig(task=TaskConfig(rewards={}))
ConfigStore.instance().store(name="train_schema", node=_SCHEMA)


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as a typed ``TrainConfig`` (Hydra already type-checked it)."""
    return OmegaConf.to_object(cfg)


class Interrupted(Exception):
    """The run stopped on SIGINT / SIGTERM after writing a checkpoint and the model."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def finish_logger(trainer) -> None:
    """Close a wandb run before the process exits: Lightning's WandbLogger leaves that to wandb's
    exit hook, which on a loaded machine could lose the last history row (the final evaluation)."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            logger.experiment.finish()


def run(cfg: TrainConfig, logged_config: dict | None = None) -> dict[str, float]:
    """Train with ``cfg`` (baseline evaluation, fit, final evaluation); returns the last logged metrics.

    Raises :class:`Interrupted` when a signal stopped the run (its checkpoint is written)."""
    apply_huge_pages(cfg.trainer.huge_pages)
    # Only now: importing lightning makes torch's first CPU allocation, which fixes the allocator.
    from grpo_lightning.build import build_run, fit  # noqa: PLC0415

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
    train_cfg = to_train_config(cfg)
    try:
        metrics = run(train_cfg, logged_config=OmegaConf.to_container(cfg, resolve=True))
    except Interrupted as stop:
        sys.exit(128 + stop.signum)
    except Exception as err:  # the user's: one or two lines, exit 2; a bug: re-raised, with its traceback
        end_on_error(err, user_errors=USER_ERRORS)
        raise
    shown = {k: round(v, 4) for k, v in metrics.items() if k.split("/")[0] in ("reward", "kl", "train", "val")}
    print(f"final metrics: {shown}")


def cli() -> None:
    """The console script: :func:`main` with errors ended as :mod:`grpo_lightning.cli_errors` says
    (one or two lines and exit 2 for what the user can fix, a traceback for a bug)."""
    run_cli(main, user_errors=USER_ERRORS)


if __name__ == "__main__":
    cli()
