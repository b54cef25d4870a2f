"""The teachers of on-policy distillation, one file per kind (``algorithm.teacher.kind``).

Each kind is registered in :data:`grpo_lightning.config.teacher.TEACHER_KINDS` with its options
(the built-in ones by their ``"module:Class"`` path, imported here only when a run builds one).
A teacher class has ``from_config(cfg, tokenizer, policy)`` and, as :class:`LocalTeacher` shows,
``bind(policy, reference)`` and ``score(rollout, batches, need_rows, need_argmax)``.
"""

from __future__ import annotations

import importlib

from lightning.pytorch.utilities import rank_zero_info

from grpo_lightning.config.teacher import TEACHER_KINDS


def teacher_class(kind: str) -> type:
    """The class registered for ``kind`` (a ``"module:Class"`` path is imported here)."""
    entry = TEACHER_KINDS[kind]
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    return entry


def build_teacher(cfg, tokenizer, policy, formatter=None):
    """The teacher ``cfg.algorithm.teacher`` describes (None when none is), from a TrainConfig ``cfg``,
    the student's ``tokenizer``, the loaded ``policy`` and its prompt ``formatter``."""
    teacher = cfg.algorithm.teacher
    if not teacher.active:
        return None
    rank_zero_info(teacher_line(cfg))
    return teacher_class(teacher.resolved_kind()).from_config(cfg, tokenizer, policy, formatter)


def teacher_line(cfg) -> str:
    """What the run distills from and how, said once at start-up (the temperature the teacher scores at)."""
    t, a = cfg.algorithm.teacher, cfg.algorithm
    kind = t.resolved_kind()
    where = {"folder": f" {t.path}", "server": f" {t.server.url}"}.get(kind, "")
    options = getattr(t, t.objective, None)
    said = ", ".join(f"{k} {v}" for k, v in vars(options).items()) if options is not None else ""
    pure = bool(cfg.task.rewards) and not any(cfg.task.rewards.values())
    return (
        f"distillation: teacher {kind}{where}, objective {t.objective}{f' ({said})' if said else ''}, weight {t.weight:g}"
        f"{', every reward weight 0 (pure distillation)' if pure else ' beside the rewards'}; it scores the student's "
        f"tokens at the sampling temperature {cfg.rollout.temperature:g}; its pass "
        f"{'joins the reference pass (algorithm.beta > 0)' if a.beta > 0 else 'replaces the reference pass (algorithm.beta=0)'}"
    )
