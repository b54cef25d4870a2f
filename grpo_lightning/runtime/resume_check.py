"""The run's config, stored in each checkpoint as JSON-able data, and the check that a resumed run
can continue exactly: the same model, task (and its options), group size, batch and seed.

A resume with any of those changed would train on other prompts, seeds or shapes than the
checkpoint's run while looking like its continuation, so it is refused with the keys that differ,
unless ``trainer.resume_allow_changes=true``. Other fields (learning rate, max_steps, logging)
may change freely; ``trainer.max_steps`` below the checkpoint's step is refused.
"""

from __future__ import annotations

import dataclasses
import json

from grpo_lightning.errors import CheckpointError

CONFIG_KEY = "grpo_config"  # the checkpoint's entry
EXACT_RESUME_KEYS = (
    "model.name_or_path",
    "task",
    "rollout.num_generations",
    "rollout.prompts_per_step",
    "trainer.seed",
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


def _watched(key: str) -> bool:
    return any(key == w or key.startswith(f"{w}.") for w in EXACT_RESUME_KEYS)


def changed_keys(saved: dict, now: dict) -> list[str]:
    """The keys that break exact resume whose values differ, as ``key: saved -> now``."""
    a, b = _flat(saved), _flat(now)
    return [
        f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if _watched(k) and a.get(k) != b.get(k)
    ]


def check_resume(checkpoint: dict, now: dict | None, max_steps: int, allow_changes: bool, path) -> None:
    """Refuse resuming ``checkpoint`` (loaded from ``path``) under the config ``now``, as the module says."""
    step = int(checkpoint.get("global_step", 0))
    if max_steps < step:
        raise CheckpointError(
            f"checkpoint {path} is at step {step}, past trainer.max_steps={max_steps}: raise trainer.max_steps "
            f"above {step} to train on, or resume from an earlier checkpoint"
        )
    saved = checkpoint.get(CONFIG_KEY)
    if now is None or saved is None or allow_changes:
        return
    changed = changed_keys(saved, now)
    if changed:
        raise CheckpointError(
            f"checkpoint {path} was written with another config, so the run would not continue exactly: "
            f"{'; '.join(changed)}. Restore those values, or set trainer.resume_allow_changes=true to resume anyway"
        )
