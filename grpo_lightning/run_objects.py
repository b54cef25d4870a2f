"""Objects a Python caller hands to ``build_run`` in place of config names, as TRL's
``GRPOTrainer(model, reward_funcs, train_dataset=..., processing_class=..., peft_config=...)``
takes them.

Each object either sets the config field it stands for (a model id, a PEFT ``LoraConfig``,
reward functions by their names), so validation, the logged config and resuming see it, or is
used as it is (a loaded model and its tokenizer, the dataset's rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from grpo_lightning.errors import ConfigError, DataError, PluginError
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS

_GIVEN: dict[str, Callable] = {}  # reward functions registered here from objects: a notebook may redefine them


@dataclass
class RunObjects:
    """What ``build_run`` uses instead of loading by name (None: load as the config says)."""

    policy: Any = None
    tokenizer: Any = None
    records: tuple[list[dict], list[dict]] | None = None


def take_objects(
    cfg,
    *,
    model: Any = None,
    tokenizer: Any = None,
    train_dataset: Iterable[dict] | None = None,
    eval_dataset: Iterable[dict] | None = None,
    reward_funcs: Callable | list[Callable] | dict[str, Callable] | None = None,
    peft_config: Any = None,
) -> RunObjects:
    """Set ``cfg`` from the objects that stand for config fields; return those used as they are."""
    objects = RunObjects(tokenizer=tokenizer)
    if isinstance(model, str):
        cfg.model.name_or_path = model
    elif model is not None:
        if tokenizer is None:
            raise ConfigError("build_run(model=<a loaded model>) needs tokenizer=<its tokenizer> too")
        objects.policy = model
    if peft_config is not None:
        take_peft(cfg, peft_config)
    if reward_funcs is not None:
        take_rewards(cfg, reward_funcs)
    if train_dataset is not None:
        objects.records = (rows(train_dataset, "train_dataset"), rows(eval_dataset or [], "eval_dataset"))
    elif eval_dataset is not None:
        raise ConfigError("build_run(eval_dataset=...) needs train_dataset=... too (the task makes both otherwise)")
    return objects


def rows(dataset: Iterable[dict], name: str) -> list[dict]:
    """A ``datasets.Dataset`` (or any iterable of dicts) as records; each needs a ``prompt``."""
    records = [dict(row) for row in dataset]
    missing = [i for i, r in enumerate(records) if "prompt" not in r]
    if missing:
        raise DataError(f"{name}: rows {missing[:5]} have no 'prompt' column; every row needs one (as in TRL)")
    return records


def take_rewards(cfg, funcs: Callable | list[Callable] | dict[str, Callable]) -> None:
    """Register the functions under their names and make them ``task.rewards`` (a weight set
    there before is kept, else 1.0); a ``correctness_reward`` not among them is cleared."""
    named = funcs if isinstance(funcs, dict) else {_name(f): f for f in (funcs if isinstance(funcs, list) else [funcs])}
    for name, fn in named.items():
        if name in REWARD_FUNCTIONS and REWARD_FUNCTIONS[name] is not fn:
            if _GIVEN.get(name) is not REWARD_FUNCTIONS[name]:
                raise PluginError(
                    f"reward_funcs: {name!r} is already a registered reward function; pass {{'my_name': fn}} instead"
                )
            REWARD_FUNCTIONS.entries.pop(name)  # the same name given again (a re-run notebook cell)
        _GIVEN[name] = REWARD_FUNCTIONS.add(name, fn)
    cfg.task.rewards = {name: cfg.task.rewards.get(name, 1.0) for name in named}
    if cfg.task.correctness_reward not in named:
        cfg.task.correctness_reward = None


def _name(fn: Callable) -> str:
    name = getattr(fn, "__name__", None)
    if not name or name == "<lambda>":
        raise ConfigError("reward_funcs: a function without a name (a lambda, a partial); pass {'name': fn} instead")
    return name


def take_peft(cfg, peft: Any) -> None:
    """A PEFT ``LoraConfig`` as ``model.lora``: rank, alpha, dropout and target modules."""
    if not hasattr(peft, "r") or not hasattr(peft, "lora_alpha"):
        raise ConfigError(f"peft_config: a peft.LoraConfig is supported, not {type(peft).__name__}")
    targets = peft.target_modules
    lora = cfg.model.lora
    lora.rank, lora.alpha, lora.dropout = int(peft.r), float(peft.lora_alpha), float(peft.lora_dropout)
    lora.target_modules = [targets] if isinstance(targets, str) else sorted(targets or [])
