"""The Hydra entry point: ``grpo-lightning key=value ...``, or ``python -m grpo_lightning.train key=value ...``.

Thin on purpose: compose and type-check the config, validate it before any model loads,
build the run (``build.build_run``), fit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from grpo_lightning.build import build_run, fit
from grpo_lightning.config import ConfigError, TrainConfig

# The configs ship inside the package (grpo_lightning/conf), so an installed wheel has them too.
CONF_DIR = Path(__file__).resolve().parent / "conf"

# The schema Hydra composes onto. Its task.rewards is empty: Hydra merges dicts, so a default
# there would leak the arithmetic rewards into every task group (each grpo_lightning/conf/task/*.yaml names its own).
_SCHEMA = TrainConfig()
_SCHEMA.task.rewards = {}
ConfigStore.instance().store(name="train_schema", node=_SCHEMA)


def to_train_config(cfg: DictConfig) -> TrainConfig:
    """The composed DictConfig as a typed ``TrainConfig`` (Hydra already type-checked it)."""
    return OmegaConf.to_object(cfg)


def run(cfg: TrainConfig, logged_config: dict | None = None) -> dict[str, float]:
    """Train with ``cfg`` (baseline evaluation, fit, final evaluation); returns the last logged metrics."""
    built = build_run(cfg, logged_config=logged_config)
    trainer = built.trainer(cfg)
    fit(built, trainer, cfg)
    return {k: float(v) for k, v in trainer.logged_metrics.items()}


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    train_cfg = to_train_config(cfg)
    try:
        metrics = run(train_cfg, logged_config=OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    shown = {k: round(v, 4) for k, v in metrics.items() if k.split("/")[0] in ("reward", "kl", "train", "val")}
    print(f"final metrics: {shown}")


if __name__ == "__main__":
    main()
