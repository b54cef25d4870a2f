"""The teachers of on-policy distillation, one file per kind (``algorithm.teacher.kind``).

Each kind is registered in :data:`grpo_lightning.config.teacher.TEACHER_KINDS` with its options
(the built-in ones by their ``"module:Class"`` path, imported here only when a run builds one).
A teacher class has ``from_config(cfg, tokenizer, policy)`` and, as :class:`LocalTeacher` shows,
``bind(policy, reference)`` and ``score(rollout, batches, need_rows, need_argmax)``.
"""

from __future__ import annotations

import importlib

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
    return teacher_class(teacher.resolved_kind()).from_config(cfg, tokenizer, policy, formatter)
