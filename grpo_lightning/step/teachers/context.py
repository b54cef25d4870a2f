"""``kind=context``: context distillation. The teacher is the initial policy, frozen, shown a prompt
the student does not see (``algorithm.teacher.context.*``: its own system prompt, few-shot examples
or hints before the question); it scores the student's completion under that prompt, so the student
learns to answer without it as the prompted model does.

The frozen initial policy costs no memory when the run has a reference model (``algorithm.beta > 0``:
the reference is that model) or is a LoRA policy (the base with the adapters off, which is the initial
policy while the adapters start at zero); otherwise it is a frozen copy of the policy, made once.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import replace

from torch import nn

from grpo_lightning.algorithm import MicroBatch
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models.lora import AdapterDisabledReference, is_peft_model, reference_model
from grpo_lightning.records import RolloutBatch
from grpo_lightning.step.micro_batches import micro_batches
from grpo_lightning.step.teachers.local import LocalTeacher


def teacher_formatter(cfg, tokenizer) -> tuple[PromptFormatter, str]:
    """The teacher's prompt formatter and the text put before each question (``cfg``: a TrainConfig)."""
    t, c = cfg.task, cfg.algorithm.teacher.context
    system = c.system_prompt if c.system_prompt is not None else t.system_prompt
    return PromptFormatter(tokenizer, system, t.instruction, use_chat_template=t.chat_template), c.prefix_text()


class ContextTeacher(LocalTeacher):
    name = "context"

    def __init__(self, cfg, formatter: PromptFormatter, prefix: str):
        super().__init__(cfg)
        self.formatter, self.prefix = formatter, prefix
        self._frozen = None
        self._ids: dict[str, list[int]] = {}

    @classmethod
    def from_config(cls, cfg, tokenizer, policy, formatter=None) -> ContextTeacher:
        return cls(cfg.algorithm, *teacher_formatter(cfg, tokenizer))

    def bind(self, policy: nn.Module, reference) -> None:
        if reference is not None:
            self._frozen = reference
        elif is_peft_model(policy):
            self._frozen = AdapterDisabledReference(policy)
        else:
            self._frozen = copy.deepcopy(policy).requires_grad_(False).eval()

    @contextmanager
    def model(self):
        if self._frozen is None:
            raise RuntimeError("ContextTeacher.bind(policy, reference) was not called (GRPOModule calls it)")
        with reference_model(self._frozen) as model:
            was_training = model.training
            model.eval()
            try:
                yield model
            finally:
                model.train(was_training)

    def prompt_ids(self, question: str) -> list[int]:
        """The teacher's prompt for ``question``: the prefix, then the question, formatted (cached)."""
        if question not in self._ids:
            self._ids[question] = self.formatter(self.prefix + question)
        return self._ids[question]

    def batches_for(self, rollout: RolloutBatch, batches: list[MicroBatch]) -> list[MicroBatch]:
        """The same rows under the teacher's prompts: the completions keep their columns."""
        if not rollout.prompts:
            raise ValueError("algorithm.teacher.kind=context needs the rollout's prompt texts (RolloutBatch.prompts)")
        pad = self.formatter.tokenizer.pad_token_id or 0  # padding is masked: any id serves
        ids, mask = RolloutBatch.pad_prompts([self.prompt_ids(q) for q in rollout.prompts], pad)
        device = rollout.prompt_ids.device
        theirs = replace(rollout, prompt_ids=ids.to(device), prompt_mask=mask.to(device))
        size = batches[0].rows.stop - batches[0].rows.start if batches else rollout.num_sequences
        return list(micro_batches(theirs, size))
