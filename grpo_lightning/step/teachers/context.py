"""``kind=context``: context distillation. The teacher is the initial policy, frozen, shown a prompt
the student does not see (``algorithm.teacher.context.*``: its own system prompt, few-shot examples
or hints before the question); it scores the student's completion under that prompt, so the student
learns to answer without it as the prompted model does.

A vision-language policy's teacher is shown a system prompt only (``algorithm.teacher.context.system_prompt``;
the image stays in the user's message): its prompt ids are the student's with the chat template's
system block swapped (:class:`SystemSwap`), so the images, their tokens and their features are the
student's own.

The frozen initial policy costs no memory when the run has a reference model (``algorithm.beta > 0``:
the reference is that model) or is a LoRA policy (the base with the adapters off, which is the initial
policy while the adapters start at zero); otherwise it is a frozen copy of the policy, made once (its
frozen parameters, a VLM's frozen tower, shared).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import replace

from torch import nn

from grpo_lightning.algorithm import MicroBatch
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.data.vision_prompting import VisionPrompts
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.lora import AdapterDisabledReference, is_peft_model, reference_model
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.records import RolloutBatch
from grpo_lightning.step.micro_batches import micro_batches
from grpo_lightning.step.teachers.local import LocalTeacher


def teacher_formatter(cfg, tokenizer) -> tuple[PromptFormatter, str]:
    """The teacher's prompt formatter and the text put before each question (``cfg``: a TrainConfig)."""
    t, c = cfg.task, cfg.algorithm.teacher.context
    system = c.system_prompt if c.system_prompt is not None else t.system_prompt
    return PromptFormatter(tokenizer, system, t.instruction, use_chat_template=t.chat_template), c.prefix_text()


class SystemSwap:
    """A vision-language student's prompt ids -> the teacher's: the chat template's system block (the
    student's system prompt, or the template's default) replaced by one with the teacher's system prompt.

    The two blocks are read off one rendered probe conversation (the ids where the two renderings differ,
    up to their common tail); a second probe, with image parts and other text, must come out as the
    teacher's own rendering, else the template does not render the system block on its own and the run
    is refused (:meth:`check`)."""

    PROBE = [{"role": "user", "content": "?"}]
    CHECK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a b"}, {"type": "image"}]}]

    def __init__(self, processor, student_system: str | None, teacher_system: str):
        self.student = VisionPrompts(processor, student_system)
        self.teacher = VisionPrompts(processor, teacher_system)
        self.processor = processor
        ours, theirs = self.rendered(self.student, self.PROBE), self.rendered(self.teacher, self.PROBE)
        tail = 0
        while tail < min(len(ours), len(theirs)) and ours[-1 - tail] == theirs[-1 - tail]:
            tail += 1
        self.ours, self.theirs = ours[: len(ours) - tail], theirs[: len(theirs) - tail]

    def rendered(self, prompts: VisionPrompts, messages: list[dict]) -> list[int]:
        text = self.processor.apply_chat_template(
            prompts.messages(messages, 0), tokenize=False, add_generation_prompt=True
        )
        return self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def extra_tokens(self) -> int:
        """How many more prompt tokens the teacher reads than the student."""
        return len(self.theirs) - len(self.ours)

    def check(self) -> None:
        """ConfigError when swapping the system block does not give the teacher's own rendering."""
        try:
            swapped = self(self.rendered(self.student, self.CHECK))
        except ValueError:  # the probe's student rendering does not even start with the block
            swapped = None
        if swapped != self.rendered(self.teacher, self.CHECK):
            raise ConfigError(
                "algorithm.teacher.kind=context with a vision-language policy: its chat template does not render the "
                "system prompt as a block of its own before the messages, so the teacher's prompt cannot be the "
                "student's with another system prompt; use a folder teacher (algorithm.teacher.path)"
            )

    def __call__(self, ids: list[int]) -> list[int]:
        if ids[: len(self.ours)] != self.ours:
            raise ValueError(
                "algorithm.teacher.kind=context: a prompt does not start with the student's system block (a row "
                "with its own system message?); give the rows without one, the teacher's goes in "
                "algorithm.teacher.context.system_prompt"
            )
        return self.theirs + ids[len(self.ours) :]


def system_swap(cfg, tokenizer) -> SystemSwap | None:
    """A vision-language student's :class:`SystemSwap` (None for a text student); ``cfg`` a TrainConfig."""
    processor = processor_of(tokenizer)
    if processor is None:
        return None
    c = cfg.algorithm.teacher.context
    if c.prefix or c.prefix_file is not None:
        raise ConfigError(
            "algorithm.teacher.context.prefix/prefix_file with a vision-language policy: its teacher is shown a "
            "system prompt only (the images stay in the user's message); put the examples or hints in "
            "algorithm.teacher.context.system_prompt"
        )
    system = c.system_prompt if c.system_prompt is not None else cfg.task.system_prompt
    return SystemSwap(processor, cfg.task.system_prompt, system or "")


class ContextTeacher(LocalTeacher):
    name = "context"

    def __init__(self, cfg, formatter: PromptFormatter, prefix: str, swap: SystemSwap | None = None):
        super().__init__(cfg)
        self.formatter, self.prefix, self.swap = formatter, prefix, swap
        self._frozen = None
        self._ids: dict[str, list[int]] = {}

    @classmethod
    def from_config(cls, cfg, tokenizer, policy, formatter=None) -> ContextTeacher:
        return cls(cfg.algorithm, *teacher_formatter(cfg, tokenizer), system_swap(cfg, tokenizer))

    def bind(self, policy: nn.Module, reference) -> None:
        if reference is not None:
            self._frozen = reference
        elif is_peft_model(policy):
            self._frozen = AdapterDisabledReference(policy)
        else:
            # The policy's frozen parameters (a VLM's frozen tower) are shared, not copied: equal forever.
            shared = {id(p): p for p in policy.parameters() if not p.requires_grad}
            self._frozen = copy.deepcopy(policy, memo=shared).requires_grad_(False).eval()

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
        """The same rows under the teacher's prompts: the completions keep their columns (and the images
        their rows: a vision-language prompt keeps its image tokens, in its user message)."""
        if self.swap is not None:
            rows = zip(rollout.prompt_ids.cpu(), rollout.prompt_mask.cpu(), strict=True)
            theirs = [self.swap(row[m.bool()].tolist()) for row, m in rows]
            return self._batches(rollout, batches, theirs)
        if not rollout.prompts:
            raise ValueError("algorithm.teacher.kind=context needs the rollout's prompt texts (RolloutBatch.prompts)")
        return self._batches(rollout, batches, [self.prompt_ids(q) for q in rollout.prompts])

    def _batches(self, rollout: RolloutBatch, batches: list[MicroBatch], prompts: list[list[int]]) -> list[MicroBatch]:
        pad = self.formatter.tokenizer.pad_token_id or 0  # padding is masked: any id serves
        ids, mask = RolloutBatch.pad_prompts(prompts, pad)
        device = rollout.prompt_ids.device
        theirs = replace(rollout, prompt_ids=ids.to(device), prompt_mask=mask.to(device))
        size = batches[0].rows.stop - batches[0].rows.start if batches else rollout.num_sequences
        return list(micro_batches(theirs, size))
