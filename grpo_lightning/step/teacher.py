"""``DistillStep``: the teacher's part of a training step (``algorithm.teacher``, docs/distillation.md).

Once per generation batch, before the first backward (like the reference pass, on the same
micro-batches, packed, through the chunked head): the teacher's log-probs of the student's sampled
tokens at the sampling temperature, and as the objective and metrics need them its argmax token and
its final hidden states at the scored positions (:meth:`prepare`). Per micro-batch of each pass: a
divergence objective's per-token value from both models' hidden states, chunked over the vocabulary
(:meth:`divergence`); after the first pass's backward its sums for the metrics (:meth:`record`).

The teacher pass joins the reference pass (both run when ``algorithm.beta > 0``); a context teacher
with ``beta > 0`` is the reference model itself, shown another prompt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from grpo_lightning.algorithm import MicroBatch
from grpo_lightning.algorithm.distillation import (
    DISTILL_SUMS,
    TEACHER_OBJECTIVES,
    HeadRows,
    divergence_rows,
    teacher_options,
)
from grpo_lightning.algorithm.objective import LossTerms
from grpo_lightning.config.algorithm import logprob_chunk_mb
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.forward import CapturedRows, plain_output_head
from grpo_lightning.records import RolloutBatch, TokenLogProbs


@dataclass
class TeacherScores:
    """What a teacher returns for one generation batch ([N, C] on the rollout's device)."""

    logprobs: TokenLogProbs  # the teacher's log-probs of the sampled tokens
    argmax: torch.Tensor | None = None  # long, the teacher's most likely token at each position; -1: not scored
    rows: list[CapturedRows] | None = None  # per micro-batch: its hidden states at the scored positions


def head_argmax(rows: torch.Tensor, head: torch.nn.Module, budget_mb: float) -> torch.Tensor:
    """The argmax token [n] of ``head(rows)``, a chunk of rows at a time (never [n, V] logits)."""
    step = max(1, int(budget_mb * 2**20) // (4 * head.weight.shape[0]))
    with torch.no_grad():
        return torch.cat([head(rows[i : i + step]).argmax(dim=-1) for i in range(0, rows.shape[0], step)])


def scatter_rows(values: torch.Tensor, valid: torch.Tensor, fill) -> torch.Tensor:
    """[n] values of the real completion positions into the [b, C] layout of ``valid``."""
    out = torch.full(valid.shape, fill, dtype=values.dtype, device=values.device)
    return out.masked_scatter(valid.to(values.device), values)


class NoTeacher:
    """What the module calls when no teacher is configured: nothing happens."""

    active = False

    def prepare(self, rollout: RolloutBatch, batches: list[MicroBatch]) -> None:
        return None

    def capture(self, index: int) -> None:
        return None

    def divergence(self, index: int, capture, temperature: float) -> None:
        return None

    def record(self, index: int, mb: MicroBatch, terms: LossTerms) -> None:
        """Nothing to record."""

    def metrics(self, sum_over_ranks) -> dict[str, float]:
        return {}


class DistillStep:
    """The teacher's work in :class:`~grpo_lightning.step.module.GRPOModule`'s step (module doc)."""

    active = True

    @classmethod
    def attach(cls, cfg, teacher, policy, reference) -> DistillStep | NoTeacher:
        """The step's teacher part: ``teacher`` bound to the module's models (a context teacher is the
        reference model when there is one), or :class:`NoTeacher`."""
        if teacher is None:
            return NoTeacher()
        if TEACHER_OBJECTIVES[cfg.teacher.objective].full_distribution and plain_output_head(policy) is None:
            raise ConfigError(
                f"algorithm.teacher.objective={cfg.teacher.objective} reads the policy's final hidden states and output "
                f"head, and {type(policy).__name__} has no plain head (logits = head(hidden): no soft-capping, not "
                "sharded by fsdp); use algorithm.teacher.objective=reverse_kl"
            )
        teacher.bind(policy, reference)
        return cls(cfg, teacher)

    def __init__(self, cfg, teacher):
        self.cfg = cfg  # the AlgorithmConfig; its ``teacher`` node
        self.teacher = teacher
        self.objective = TEACHER_OBJECTIVES[cfg.teacher.objective]
        self.scores: TeacherScores | None = None
        self._sums: list[torch.Tensor] = []
        self._agreement: list[torch.Tensor] = []
        self._student_argmax: torch.Tensor | None = None
        self._seen: set[int] = set()  # micro-batches of this generation batch already recorded (the first pass)
        self.seconds = 0.0

    @property
    def needs_rows(self) -> bool:
        return self.objective.full_distribution

    def needs_student_rows(self, index: int) -> bool:
        """Whether micro-batch ``index``'s training forward must keep its hidden states: always for a
        divergence, on the first pass for the agreement metric."""
        return self.needs_rows or (index not in self._seen and self.cfg.teacher.agreement)

    def capture(self, index: int) -> list[CapturedRows] | None:
        """A list for the training forward's hidden states when :meth:`needs_student_rows`, else None."""
        return [] if self.needs_student_rows(index) else None

    def budget(self, device: torch.device) -> float:
        return logprob_chunk_mb(self.cfg.logprob_chunk_mb, device.type, frozen_head=True)

    # ------------------------------------------------------------------ once per generation batch
    def prepare(self, rollout: RolloutBatch, batches: list[MicroBatch]) -> TokenLogProbs:
        """The teacher pass; returns its log-probs for :class:`PreparedBatch`."""
        start = time.perf_counter()
        self._sums, self._agreement, self._seen = [], [], set()
        self.scores = self.teacher.score(rollout, batches, self.needs_rows, self.cfg.teacher.agreement)
        if self.needs_rows and self.scores.rows is None:
            raise ConfigError(
                f"algorithm.teacher.objective={self.objective.name} needs the teacher's output head and hidden states, "
                f"which the {self.teacher.name} teacher does not give; use algorithm.teacher.objective=reverse_kl"
            )
        self.seconds = time.perf_counter() - start
        return self.scores.logprobs

    # ------------------------------------------------------------------ per micro-batch
    def divergence(
        self, index: int, capture: list[CapturedRows] | None, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A divergence objective's (value with gradient, finite) for micro-batch ``index``, [b, C]; on
        the first pass also the student's argmax (for the agreement metric). ``capture``: the training
        forward's rows."""
        student = capture[0] if capture else None  # None: no plain head (no agreement metric then)
        first_pass = index not in self._seen
        self._student_argmax = None
        if first_pass and self.cfg.teacher.agreement and student is not None:
            argmax = head_argmax(student.rows.detach(), student.head, self.budget(student.rows.device))
            self._student_argmax = scatter_rows(argmax, student.valid, -1)
        if not self.needs_rows:
            return None
        teacher = self.scores.rows[index]
        head, t_head = student.head, teacher.head
        value, finite = divergence_rows(
            self.objective,
            HeadRows(student.rows, head.weight, head.bias),
            HeadRows(teacher.rows, t_head.weight.to(student.rows.device), _bias(t_head, student.rows.device)),
            teacher_options(self.cfg.teacher),
            temperature,
            self.budget(student.rows.device),
        )
        return scatter_rows(value, student.valid, 0.0), scatter_rows(finite, student.valid, True)

    def record(self, index: int, mb: MicroBatch, terms: LossTerms) -> None:
        """The first pass's sums (after its backward): the objective's and the argmax agreement."""
        if terms.distill is None or index in self._seen:
            return
        self._seen.add(index)
        self._sums.append(torch.where(torch.isfinite(terms.loss.detach()), terms.distill, 0.0))
        teacher_argmax = self.scores.argmax if self.scores is not None else None
        if self._student_argmax is not None and teacher_argmax is not None:
            theirs = teacher_argmax[mb.rows, : mb.num_cols].to(self._student_argmax.device)
            counted = terms.token_mask.bool() & (theirs >= 0) & (self._student_argmax >= 0)
            same = (self._student_argmax == theirs) & counted
            self._agreement.append(torch.stack([same.sum().float(), counted.sum().float()]))
        self._student_argmax = None

    # ------------------------------------------------------------------ metrics
    def metrics(self, sum_over_ranks) -> dict[str, float]:
        """``distill/*`` of the step over every rank (``sum_over_ranks``: the module's all-reduce)."""
        if not self._sums:
            return {}
        sums = torch.stack(self._sums).sum(dim=0)
        agreement = torch.stack(self._agreement).sum(dim=0) if self._agreement else sums.new_zeros(2)
        totals = sum_over_ranks(torch.cat([sums, agreement.to(sums.device)])).tolist()
        named = dict(zip(DISTILL_SUMS, totals[: len(DISTILL_SUMS)], strict=True))
        tokens, sequences = max(named["tokens"], 1.0), max(named["sequences"], 1.0)
        out = {
            "distill/kl": named["kl"] / tokens,
            "distill/kl_k3": named["kl_k3"] / tokens,
            "distill/kl_seq": named["kl"] / sequences,
            "distill/advantage_mean": named["advantage"] / tokens,
            "distill/advantage_seq": named["advantage"] / sequences,
            "distill/teacher_seconds": self.seconds,
        }
        if self.objective.full_distribution:
            out["distill/divergence"] = named["divergence"] / tokens
        if totals[-1] > 0:
            out["distill/argmax_agreement"] = totals[-2] / totals[-1]
        return out


def _bias(head: torch.nn.Module, device: torch.device) -> torch.Tensor | None:
    return head.bias.to(device) if getattr(head, "bias", None) is not None else None
