"""The run's config, stored in each checkpoint as JSON-able data, and what a resume does with a
config that differs from it: every changed field is either applied (and said) or refused.

- Refused, naming ``trainer.resume_allow_changes``: the model, task (and its options), group
  size, batch and seed. A resume with any of those changed would train on other prompts, seeds or
  shapes than the checkpoint's run while looking like its continuation.
- Refused always: the model's shape (the tiny model's sizes and alphabet, LoRA's rank, targets and
  config file): no setting can load weights of one shape into another. Checked before the model
  loads (:func:`check_before_loading`), so the answer is one line within seconds.
- Applied, and said in one line when the run resumes: everything else. Most fields are read from
  the config as the run is built; the optimizer's learning rate and weight decay are stored in
  the checkpoint's optimizer and schedule state, which would silently win, so they are set again
  from the config once that state is restored (:func:`apply_optimizer_settings`). The checkpoints
  the resumed run writes record its config: what ran.

``trainer.max_steps`` below the checkpoint's step is refused.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from pickle import UnpicklingError

import torch

from grpo_lightning.errors import CheckpointError
from grpo_lightning.records.plain_state import NOT_CODE

CONFIG_KEY = "grpo_config"  # the checkpoint's entry
EXACT_RESUME_KEYS = (
    "model.name_or_path",
    "model.tiny",
    "model.lora",
    "task",
    "rollout.num_generations",
    "rollout.prompts_per_step",
    "trainer.seed",
)
SHAPE_KEYS = (
    "model.tiny.hidden_size",
    "model.tiny.num_layers",
    "model.tiny.num_heads",
    "model.tiny.alphabet",
    "model.lora.rank",
    "model.lora.target_modules",
    "model.lora.config_file",
)
NOT_SETTINGS = ("trainer.resume", "trainer.resume_allow_changes")  # how to resume, not what runs
OPTIMIZER_KEYS = {"lr": "algorithm.lr", "weight_decay": "algorithm.weight_decay"}  # param group -> config
NOT_PLAIN_DATA = (
    f"holds objects that are not plain data (tensors, numbers, strings, lists, dicts), so it is refused: {NOT_CODE}"
)


def config_record(cfg) -> dict:
    """``cfg`` (a TrainConfig) as JSON-able data: what ``torch.load(weights_only=True)`` reads back."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def _flat(record: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _under(key: str, roots: tuple[str, ...]) -> bool:
    return any(key == w or key.startswith(f"{w}.") for w in roots)


def _differences(saved: dict, now: dict, keep) -> list[str]:
    a, b = _flat(saved), _flat(now)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if keep(k) and a.get(k) != b.get(k)]


def changed_keys(saved: dict, now: dict) -> list[str]:
    """The keys that break exact resume whose values differ, as ``key: saved -> now``."""
    return _differences(saved, now, lambda k: _under(k, EXACT_RESUME_KEYS))


def changed_shape(saved: dict, now: dict) -> list[str]:
    """The model shape options whose values differ."""
    return _differences(saved, now, lambda k: _under(k, SHAPE_KEYS))


def applied_changes(saved: dict, now: dict) -> list[str]:
    """The other fields whose values differ: the resumed run applies them."""
    return _differences(saved, now, lambda k: not _under(k, (*EXACT_RESUME_KEYS, *NOT_SETTINGS)))


def check_resume(checkpoint: dict, now: dict | None, max_steps: int, allow_changes: bool, path) -> None:
    """Refuse resuming ``checkpoint`` (loaded from ``path``) under the config ``now``, as the module says."""
    step = int(checkpoint.get("global_step", 0))
    if max_steps < step:
        raise CheckpointError(
            f"checkpoint {path} is at step {step}, past trainer.max_steps={max_steps}: raise trainer.max_steps "
            f"above {step} to train on, or resume from an earlier checkpoint"
        )
    saved = checkpoint.get(CONFIG_KEY)
    if now is None or saved is None:
        return
    shape = changed_shape(saved, now)
    if shape:
        raise CheckpointError(
            f"checkpoint {path} holds a model of another shape: {'; '.join(shape)}. Restore those values to resume "
            f"(trainer.resume_allow_changes cannot load weights into another shape), or start fresh in another "
            f"trainer.output_dir"
        )
    changed = changed_keys(saved, now)
    if changed and not allow_changes:
        raise CheckpointError(
            f"checkpoint {path} was written with another config, so the run would not continue exactly: "
            f"{'; '.join(changed)}. Restore those values, or set trainer.resume_allow_changes=true to resume anyway"
        )


def resume_note(checkpoint: dict, now: dict | None, path) -> str | None:
    """The line a resume says about the fields it applies (and the exact-resume ones it was allowed), or None."""
    saved = checkpoint.get(CONFIG_KEY)
    if now is None or saved is None:
        return None
    changes = changed_keys(saved, now) + applied_changes(saved, now)
    if not changes:
        return None
    return f"resuming from {path} with changed settings, applied from step {checkpoint.get('global_step', 0)}: " + (
        "; ".join(changes)
    )


def read_checkpoint(path: Path) -> dict:
    """The checkpoint at ``path`` as plain data, its tensors mapped, not read (fast for any size);
    one-line :class:`CheckpointError` when it cannot be (truncated, not a checkpoint, not plain data),
    raised outside the handler so that torch's advice (turn the weights-only load off) is not passed on."""
    refused = None
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except UnpicklingError as err:
        plain = "weights only load failed" not in str(err).lower()
        refused = unreadable(path, err) if plain else f"checkpoint {path} {NOT_PLAIN_DATA}"
    except (RuntimeError, OSError, EOFError, ValueError, KeyError) as err:
        refused = unreadable(path, err)
    raise CheckpointError(refused)


def unreadable(path, err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return (
        f"checkpoint {path} cannot be read ({first}): it is truncated or not a checkpoint; resume from another one "
        f"(trainer.resume=auto takes the newest good one once this one is moved away)"
    )


def check_before_loading(path: Path | None, now: dict, max_steps: int, allow_changes: bool) -> None:
    """The resume's refusals from the checkpoint's config alone, before the model loads (within seconds)."""
    if path is not None:
        check_resume(read_checkpoint(path), now, max_steps, allow_changes, path)


def apply_optimizer_settings(trainer, now: dict) -> None:
    """Set the config's learning rate and weight decay again after the optimizer and schedule state
    were restored from a checkpoint (which holds the old ones), and the current learning rate from
    the schedule as configured now (its horizon follows ``trainer.max_steps``) at the step reached."""
    settings = _flat(now)
    schedulers = [config.scheduler for config in getattr(trainer, "lr_scheduler_configs", [])]
    for optimizer in trainer.optimizers:
        scheduler = next((s for s in schedulers if s.optimizer is optimizer), None)
        for index, group in enumerate(optimizer.param_groups):
            if OPTIMIZER_KEYS["weight_decay"] in settings:
                group["weight_decay"] = float(settings[OPTIMIZER_KEYS["weight_decay"]])
            if OPTIMIZER_KEYS["lr"] in settings:
                _set_lr(group, scheduler, index, float(settings[OPTIMIZER_KEYS["lr"]]))


def _set_lr(group: dict, scheduler, index: int, base: float) -> None:
    old = float(group.get("initial_lr", group["lr"]))
    group["initial_lr"] = base
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is not None and index < len(lambdas):  # LambdaLR (ours): base x the factor at this step
        group["lr"] = base * lambdas[index](scheduler.last_epoch)
    elif old:  # another schedule: its current factor, kept
        group["lr"] = group["lr"] * base / old
    if scheduler is not None:
        scheduler.base_lrs[index] = base
        last = getattr(scheduler, "_last_lr", None)
        if last is not None and index < len(last):
            last[index] = group["lr"]
