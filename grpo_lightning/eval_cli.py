"""``grpo-lightning-eval eval.checkpoint=PATH [overrides]``: evaluate a trained policy, no training.

The same overrides as ``grpo-lightning`` (the task, its sources, ``eval.*``, the model's shape)
compose the run; the policy's weights then come from ``eval.checkpoint``: an exported Hugging
Face folder (``<output_dir>/hf/final``), a resumable ``.ckpt`` file, or a run's output folder
(its ``hf/final``, else its newest checkpoint). It prints one row per source (task=mixed) and
one for all held-out prompts: accuracy, score, pass@k, mean length; for an episode task the
held-out episodes' reward, success, turns, tool calls and stop reasons. docs/evaluation.md.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import warnings
import zipfile
from dataclasses import replace
from pathlib import Path

import torch

from grpo_lightning.cli_errors import run_cli
from grpo_lightning.config import TrainConfig
from grpo_lightning.config.compose import compose
from grpo_lightning.environments.limits import EpisodeTaskConfig
from grpo_lightning.errors import CheckpointError
from grpo_lightning.runtime.checkpoints import checkpoints_in

FIELD = "eval.checkpoint"
COLUMNS = ("accuracy", "score", "reward", "success", "pass@", "turns", "tool_calls", "mean_length")
GROUPS = ("stop",)  # val/stop/<reason>: the episodes' stop reasons, not a source


def resolve(path: str | None) -> tuple[str, Path]:
    """``("hf", folder)`` or ``("ckpt", file)`` for ``eval.checkpoint``; a CheckpointError saying what to give."""
    hint = "give hf/final (an exported folder), a .ckpt file, or a run's output folder"
    if not path:
        raise CheckpointError(f"grpo-lightning-eval needs {FIELD}=PATH: {hint}")
    given = Path(path)
    if not given.exists():
        raise CheckpointError(f"{FIELD}={path!r} does not exist; {hint}")
    if given.is_dir():
        if (given / "config.json").is_file():
            return "hf", given
        if (given / "hf" / "final" / "config.json").is_file():
            return "hf", given / "hf" / "final"
        found = checkpoints_in(given)
        if found:
            return "ckpt", found[-1]
        raise CheckpointError(f"{FIELD}={path!r} holds no model (config.json), hf/final or checkpoints/; {hint}")
    if not zipfile.is_zipfile(given):
        raise CheckpointError(f"{FIELD}={path!r} is not a checkpoint (torch.save writes a zip archive); {hint}")
    return "ckpt", given


def load_checkpoint_weights(policy, file: Path) -> None:
    """The policy's weights from a Lightning checkpoint, read as plain data (``weights_only``)."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)["state_dict"]
    except Exception as err:  # a truncated, foreign or unsafe file
        raise CheckpointError(f"{FIELD}={str(file)!r} cannot be read as a checkpoint: {err}") from err
    weights = {k[len("policy.") :]: v for k, v in state.items() if k.startswith("policy.")}
    missing, unexpected = policy.load_state_dict(weights, strict=False)
    if missing or unexpected or not weights:
        raise CheckpointError(
            f"{FIELD}={str(file)!r} does not fit the model of this config ({len(missing)} weights missing, "
            f"{len(unexpected)} unexpected, e.g. {(missing or unexpected or ['no policy weights'])[0]}); "
            "pass the run's model.* overrides"
        )


def evaluation_config(cfg: TrainConfig) -> tuple[TrainConfig, str, Path]:
    """The run config to evaluate with: the model from an hf folder, no logger, a scratch output folder."""
    kind, where = resolve(cfg.eval.checkpoint)
    model = replace(cfg.model, name_or_path=str(where)) if kind == "hf" else cfg.model
    if kind == "ckpt" and cfg.rollout.engine != "hf":
        raise CheckpointError(
            f"{FIELD}={str(where)!r}: a .ckpt is evaluated with rollout.engine=hf; give the exported hf/final "
            f"folder to evaluate with rollout.engine={cfg.rollout.engine}"
        )
    scratch = tempfile.mkdtemp(prefix="grpo-eval-")  # never lock or write the trained run's folder
    cfg = replace(
        cfg,
        model=model,
        logger=replace(cfg.logger, kind="none"),
        trainer=replace(cfg.trainer, output_dir=scratch, resume=None),
        # No training step: a data set smaller than the training batch evaluates too.
        rollout=replace(cfg.rollout, prompts_per_step=1),
        algorithm=replace(cfg.algorithm, micro_batch_size="auto"),
    )
    return cfg, kind, where


def evaluate(cfg: TrainConfig) -> dict[str, float]:
    """Build the run, load the weights, validate once on the held-out prompts; the val/* metrics."""
    from grpo_lightning.build import build_run  # noqa: PLC0415  (after the config is known good)

    cfg, kind, where = evaluation_config(cfg)
    try:
        if cfg.task.correctness_reward is None and not isinstance(cfg.task.promoted(), EpisodeTaskConfig):
            raise CheckpointError(
                "task.correctness_reward is null: nothing defines correct, so there is nothing to evaluate"
            )
        run = build_run(cfg)
        if not run.datamodule.val_records:
            raise CheckpointError("the task has no held-out prompts: set task.val_fraction > 0 (or task.val_path)")
        if kind == "ckpt":
            load_checkpoint_weights(run.module.policy, where)
        trainer = run.trainer(cfg, logger=False, enable_progress_bar=False, limit_val_batches=1.0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results = trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
        finally:
            run.module.rollout.shutdown()
            if run.lock is not None:
                run.lock.release()
    finally:  # the scratch folder holds only the run lock: nothing to keep
        shutil.rmtree(cfg.trainer.output_dir, ignore_errors=True)
    counts: dict[str, float] = {}
    column = cfg.task.group_column  # its values' rows, as the sources'
    for record in run.datamodule.val_records:
        for name in (record.get("data_source"), str(record[column]) if column else None):
            if name is not None:
                counts[f"val/{name}/prompts"] = counts.get(f"val/{name}/prompts", 0) + 1
    return {**{k: float(v) for k, v in results[0].items()}, **counts, "val/prompts": len(run.datamodule.val_records)}


def table(metrics: dict[str, float]) -> str:
    """One row per source (in the order logged) and ``all``; columns the metrics present."""
    sources = list(dict.fromkeys(k.split("/")[1] for k in metrics if k.count("/") == 2))
    sources = [s for s in sources if s not in GROUPS]
    present = {k.rsplit("/", 1)[1] for k in metrics if k.startswith("val/") and k.split("/")[1] not in GROUPS}
    columns = ["prompts"] + [c for start in COLUMNS for c in sorted(present) if c.startswith(start)]
    rows = [(s, f"val/{s}/") for s in sources] + [("all", "val/")]
    width = max(len(name) for name, _ in rows) + 2
    lines = ["source".ljust(width) + "".join(c.rjust(13) for c in columns)]
    for name, prefix in rows:
        cells = [metrics.get(prefix + c) for c in columns]
        lines.append(name.ljust(width) + "".join(_cell(c) for c in cells))
    stops = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("val/stop/") and v}
    if stops:  # episode tasks: why the held-out episodes ended (shares)
        lines.append("stop reasons: " + ", ".join(f"{reason} {share:.0%}" for reason, share in stops.items()))
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    if value is None:
        return "-".rjust(13)
    return f"{value:13.0f}" if float(value).is_integer() and value > 1 else f"{value:13.4f}"


def main(argv: list[str]) -> None:
    cfg, _ = compose([*argv, "trainer.output_dir=."])  # no Hydra run folder here; evaluation uses a scratch one
    print(table(evaluate(cfg)))


def cli() -> None:
    """The console script ``grpo-lightning-eval``; errors end as ``grpo-lightning``'s do (one line, exit 2)."""
    run_cli(lambda: main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
