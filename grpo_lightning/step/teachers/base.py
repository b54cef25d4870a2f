"""``kind=base``: a LoRA policy's base model, its adapters switched off (no second copy of the
weights): distillation from the model the adapters started from, e.g. a large base fine-tuned by
small adapters that should keep its behaviour on the student's own samples."""

from __future__ import annotations

from contextlib import contextmanager

from grpo_lightning.models.lora import AdapterDisabledReference, is_peft_model
from grpo_lightning.step.teachers.local import LocalTeacher


class LoraBaseTeacher(LocalTeacher):
    name = "base"

    def __init__(self, cfg, policy):
        super().__init__(cfg)
        if not is_peft_model(policy):
            raise TypeError(f"algorithm.teacher.kind=base needs a LoRA (peft) policy, got {type(policy).__name__}")
        self._base = AdapterDisabledReference(policy)

    @classmethod
    def from_config(cls, cfg, tokenizer, policy, formatter=None) -> LoraBaseTeacher:
        return cls(cfg.algorithm, policy)

    @contextmanager
    def model(self):
        with self._base.active() as model:
            yield model
