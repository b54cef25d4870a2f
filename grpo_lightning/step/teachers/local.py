"""``LocalTeacher``: a teacher whose model runs in this process (a folder, a LoRA policy's base, the
initial policy under another prompt); the kinds differ only in the model and the prompt it sees.

Its pass is the reference pass's: the same micro-batches (or, for another prompt, micro-batches of
the same rows), packed, through the chunked head, no gradient, at the sampling temperature; its own
:class:`CompletionLogProbs` (its own packing probe: a teacher of another architecture is verified on
its own). On its own device if ``algorithm.teacher.device`` says so: the batches go there and the
results come back. A vision-language teacher takes the micro-batches' images as the policy's passes
do (the same pixels, positions from its prompt's ids; a prompt's features once per pass, shared by
its G samples: docs/distillation.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import nn

from grpo_lightning.algorithm import MicroBatch
from grpo_lightning.config.algorithm import logprob_chunk_mb
from grpo_lightning.models.forward import CapturedRows, CompletionLogProbs
from grpo_lightning.records import RolloutBatch, TokenLogProbs
from grpo_lightning.records.vision import moved
from grpo_lightning.step.teacher import TeacherScores, head_argmax, scatter_rows


class LocalTeacher:
    """Scores a generation batch with a model of this process; subclasses say which model (``model``)."""

    name = "local"

    def __init__(self, cfg):
        self.cfg = cfg  # the AlgorithmConfig
        self.forward = CompletionLogProbs(cfg.logprob_chunk_mb, cfg.pack_sequences, cfg.head_kernels)
        self.device = None if cfg.teacher.device == "auto" else torch.device(cfg.teacher.device)

    def bind(self, policy: nn.Module, reference) -> None:
        """Called by the module once it has its reference (a context teacher may share it)."""

    @contextmanager
    def model(self):
        """The teacher model for the duration of the pass."""
        raise NotImplementedError

    def batches_for(self, rollout: RolloutBatch, batches: list[MicroBatch]) -> list[MicroBatch]:
        """The micro-batches the teacher scores: the student's own (the same prompt)."""
        return batches

    @torch.no_grad()
    def score(
        self, rollout: RolloutBatch, batches: list[MicroBatch], need_rows: bool, need_argmax: bool
    ) -> TeacherScores:
        shape, home = rollout.completion_ids.shape, rollout.completion_ids.device
        logp = torch.zeros(shape, device=home)
        finite = torch.ones(shape, dtype=torch.bool, device=home)
        argmax = torch.full(shape, -1, dtype=torch.long, device=home) if need_argmax else None
        rows: list[CapturedRows] | None = [] if need_rows else None
        with self.model() as model:
            device = self.device or home  # auto: the policy's device, where the module put the rollout
            if next(model.parameters()).device != device:
                model.to(device)  # once: a folder's teacher loads on the CPU
            for mb in self.batches_for(rollout, batches):
                mb = _moved(mb, device)
                capture: list[CapturedRows] = []
                out = self.forward(
                    model, mb.input_ids, mb.attention_mask, mb.prompt_width, rollout.temperature,
                    packed=lambda mb=mb: mb.packed, capture=capture, vision=mb.vision,
                )  # fmt: skip
                logp[mb.rows, : mb.num_cols] = out.logp.to(home)
                finite[mb.rows, : mb.num_cols] = out.finite.to(home)
                if not capture:  # no plain head: no argmax, no rows (a divergence is refused then)
                    rows, argmax = None, None
                    continue
                if argmax is not None:
                    budget = logprob_chunk_mb(self.cfg.logprob_chunk_mb, device.type, frozen_head=True)
                    best = head_argmax(capture[0].rows, capture[0].head, budget)
                    argmax[mb.rows, : mb.num_cols] = scatter_rows(best, capture[0].valid, -1).to(home)
                if rows is not None:
                    rows.append(capture[0])
        return TeacherScores(TokenLogProbs(logp, None, finite), argmax, rows)


def _moved(mb: MicroBatch, device: torch.device) -> MicroBatch:
    """``mb`` on ``device`` (itself when it is there already)."""
    if mb.input_ids.device == device:
        return mb
    engine = mb.engine_logprobs.to(device) if mb.engine_logprobs is not None else None
    return replace(
        mb,
        input_ids=mb.input_ids.to(device),
        attention_mask=mb.attention_mask.to(device),
        completion_mask=mb.completion_mask.to(device),
        engine_logprobs=engine,
        vision=moved(mb.vision, device),
    )
