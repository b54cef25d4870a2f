"""The teacher term beside the rewards, for one micro-batch: advantages and what the metrics read.

    A_{i,t} = A_reward_i + weight x A_teacher_{i,t}

``A_reward`` is the registered advantage estimator's (group-relative: the group normalisation
scales the rewards only) and ``A_teacher`` the advantage-form objective's per-token advantage,
never normalised. With every reward weight 0 the rewards are all 0, every group is tied and
``A_reward = 0``: pure distillation. A divergence-form objective adds ``weight x
aggregate(divergence)`` to the loss instead and leaves the advantages alone.

The metrics' sums (:data:`DISTILL_SUMS`) are over the tokens in the loss, from the sampling
policy's log-probs ``log pi`` and the teacher's ``log nu`` of each sampled token, ``r = log nu -
log pi``: ``kl`` the k1 estimate of KL(pi || nu), ``-r`` (signed: a token can be more likely
under the teacher), ``kl_k3`` the k3 estimate ``exp(r) - 1 - r`` (never negative), ``advantage``
the weighted teacher advantage, ``divergence`` the divergence form's per-token value.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_lightning.algorithm.distillation.objectives import TEACHER_OBJECTIVES, DistillInputs

DISTILL_SUMS = ("kl", "kl_k3", "advantage", "divergence", "tokens", "sequences")


def teacher_active(cfg: Any) -> bool:
    """Whether an AlgorithmConfig ``cfg`` distills from a teacher with a weight > 0: then the reward
    checks' "no signal" does not hold (the teacher gives every token one)."""
    t = getattr(cfg, "teacher", None)
    return t is not None and t.active and t.weight > 0


def teacher_in_advantages(cfg: Any) -> bool:
    """Whether the teacher's term is inside the advantages (an advantage-form objective): then the
    policy term at ratio 1 is ``aggregate(-(A_reward + weight x A_teacher))``, not ``aggregate(-A_reward)``."""
    return teacher_active(cfg) and TEACHER_OBJECTIVES[cfg.teacher.objective].advantages is not None


def teacher_options(teacher_cfg: Any) -> Any:
    """The options node of the selected objective (``algorithm.teacher.<objective>``), or None."""
    name = teacher_cfg.objective
    return getattr(teacher_cfg, name) if TEACHER_OBJECTIVES.options(name) is not None else None


def mixed_advantages(
    reward_advantages: torch.Tensor,
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    token_mask: torch.Tensor,
    teacher_cfg: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``A`` [b, C] of the module doc, the weighted teacher advantage [b, C]) for an advantage-form
    objective; for a divergence form, the reward advantages broadcast and zeros."""
    objective = TEACHER_OBJECTIVES[teacher_cfg.objective]
    dtype = torch.promote_types(torch.promote_types(reward_advantages.dtype, student_logp.dtype), torch.float32)
    per_token = reward_advantages[:, None].expand(token_mask.shape).to(dtype)
    if objective.advantages is None:
        return per_token, torch.zeros_like(per_token)
    inputs = DistillInputs(student_logp.detach(), teacher_logp.detach(), token_mask)
    teacher = teacher_cfg.weight * objective.advantages(inputs, teacher_options(teacher_cfg)) * token_mask
    return per_token + teacher, teacher


def distill_sums(
    student_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    teacher_advantage: torch.Tensor,
    divergence: torch.Tensor | None,
    token_mask: torch.Tensor,
) -> torch.Tensor:
    """The sums of :data:`DISTILL_SUMS` over this micro-batch's tokens in the loss (detached, [6])."""
    mask = token_mask.float()
    r = (teacher_logp - student_logp).detach().clamp(-20.0, 20.0)
    value = divergence.detach() if divergence is not None else torch.zeros_like(mask)
    return torch.stack(
        [
            (-r * mask).sum(),
            ((torch.exp(r) - 1.0 - r) * mask).sum(),
            (teacher_advantage.detach() * mask).sum(),
            (value * mask).sum(),
            mask.sum(),
            (mask.sum(dim=1) > 0).float().sum(),
        ]
    )
