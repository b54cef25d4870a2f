"""Teacher objectives, registered by name: ``algorithm.teacher.objective`` picks one.

On-policy distillation: the student samples, a teacher scores the student's own tokens, and the
student is pushed towards the teacher on exactly the states it visits. An objective takes one of
two forms, and declares which:

- **advantage** (``advantages`` set): a per-token advantage ``[b, C]`` from the student's
  sampling log-probs and the teacher's log-probs of the sampled tokens; it goes through the
  registered policy loss like any advantage (ratio, clipping, corrections unchanged), added to
  the group-relative reward advantage (``A = A_reward + weight x A_teacher``). Only the teacher's
  log-prob of the sampled token is needed, so any teacher serves, a vLLM server included.
- **divergence** (``divergence`` set): a per-token loss with its own gradient, computed from the
  full distributions of both models at every position (:mod:`.jsd`), added to the loss as
  ``weight x aggregate(divergence)``; needs a local teacher (its output head).

Register a variant with::

    @register_teacher_objective("my_objective", options=MyOptions)
    def my_objective(x: DistillInputs, options) -> torch.Tensor: ...   # the advantage form

Pure tensor math: no Lightning, no config import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_lightning.registry import Registry


@dataclass(frozen=True)
class DistillInputs:
    """What an advantage-form objective sees for one micro-batch (all [b, C], detached)."""

    student_logp: torch.Tensor  # log pi(y_t): the policy that sampled, as the loss takes it (pi_old)
    teacher_logp: torch.Tensor  # log nu(y_t) at the same temperature
    token_mask: torch.Tensor  # float, 1 on the tokens in the loss (the model's own, never an environment's)


AdvantageFn = Callable[[DistillInputs, Any], torch.Tensor]
# (student logits [r, V], teacher logits [r, V], options) -> [r] per-token loss with gradient
DivergenceFn = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]
# (student HeadRows, teacher HeadRows, options, temperature, budget_mb) -> ([r] loss, [r] finite):
# the same divergence computed without the [r, V] logits (jsd.py's ChunkedJSD)
ChunkedFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class TeacherObjective:
    """A registered objective: exactly one of ``advantages`` and ``divergence`` is set."""

    name: str
    advantages: AdvantageFn | None = None
    divergence: DivergenceFn | None = None
    chunked: ChunkedFn | None = None  # a divergence's memory-lean form; None: row chunks of its logits

    @property
    def full_distribution(self) -> bool:
        """Needs the teacher's whole distribution at every position: a local teacher only."""
        return self.divergence is not None


TEACHER_OBJECTIVES: Registry[TeacherObjective] = Registry("teacher objective", "algorithm.teacher.objective")


def register_teacher_objective(
    name: str, *, options: type | None = None, form: str = "advantage", chunked: ChunkedFn | None = None
) -> Callable[[Callable], Callable]:
    """Register ``fn`` as ``algorithm.teacher.objective=name``; ``form`` is ``advantage``
    (``fn(DistillInputs, options) -> [b, C]``) or ``divergence`` (``fn(student_logits [r, V],
    teacher_logits [r, V], options) -> [r]``, both already divided by the temperature). Its
    ``options`` dataclass becomes ``algorithm.teacher.<name>.*``. ``chunked``: a divergence's form
    that never builds the [r, V] logits (else the step takes row chunks of them)."""
    if form not in ("advantage", "divergence"):
        raise ValueError(f"form must be 'advantage' or 'divergence', got {form!r}")

    def decorate(fn: Callable) -> Callable:
        if form == "advantage":
            entry = TeacherObjective(name, advantages=fn)
        else:
            entry = TeacherObjective(name, divergence=fn, chunked=chunked)
        TEACHER_OBJECTIVES.add(name, entry, options=options)
        return fn

    return decorate
