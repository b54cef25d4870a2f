"""``kind=folder``: a teacher from a local Hugging Face folder (``algorithm.teacher.path``), in any
dtype (``algorithm.teacher.dtype``), on its own device if ``algorithm.teacher.device`` names one."""

from __future__ import annotations

from contextlib import contextmanager

from grpo_lightning.models.teacher import load_teacher_model
from grpo_lightning.step.teachers.local import LocalTeacher


class FolderTeacher(LocalTeacher):
    name = "folder"

    def __init__(self, cfg, model):
        super().__init__(cfg)
        self._model = model

    @classmethod
    def from_config(cls, cfg, tokenizer, policy, formatter=None) -> FolderTeacher:
        t = cfg.algorithm.teacher
        return cls(cfg.algorithm, load_teacher_model(t.path, t.dtype))

    @contextmanager
    def model(self):
        yield self._model
