"""The sampled-token reverse KL as a per-token advantage (Thinking Machines, "On-Policy
Distillation", 2025; prime-rl's ``opd``, verl's PG distillation, slime's ``--use-opd``).

For a token ``y_t`` the student sampled at state ``s_t``,

    a_t = -(log pi(y_t | s_t) - log nu(y_t | s_t)) = log nu(y_t | s_t) - log pi(y_t | s_t)

is the negative single-sample (k1) estimate of the reverse KL(pi || nu) at that state, and it is
used as the token's advantage: with ``discount`` gamma > 0 each token also gets the discounted
sum of the terms of the tokens after it in its sequence,

    A_t = sum_{k >= t} gamma^(n(t, k)) a_k          (n(t, k): the model's tokens from t to k, exclusive)

counted over the model's own tokens only (an environment's tokens, loss mask 0, neither add a
term nor count a step). gamma = 0 (the default, as Thinking Machines) is ``A_t = a_t``.

Why an advantage and not a loss: through the policy loss, at ratio 1, the gradient is
``-sum_t A_t grad log pi(y_t)``, whose expectation over ``y ~ pi`` is ``grad KL(pi || nu)``
(``E_pi[(log pi - log nu) grad log pi] = grad KL``, the score-function identity), while
``log pi`` inside ``a_t`` is a constant (the sampling policy's, detached). Differentiating
``log pi - log nu`` directly would give ``E_pi[grad log pi] = 0``: the teacher would be lost
(AReaL's joint mode, torchforge PR 527). The ratio, clipping and off-policy corrections of the
registered policy loss then apply to it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grpo_lightning.algorithm.distillation.objectives import DistillInputs, register_teacher_objective


@dataclass
class ReverseKLOptions:
    """The sampled-token reverse KL (``algorithm.teacher.reverse_kl.*``)."""

    discount: float = field(
        default=0.0,
        metadata={
            "help": "gamma in [0, 1]: each token's advantage adds the gamma-discounted terms of the model's later tokens; 0: its own only."
        },
    )

    def check_fields(self, p: str) -> list[str]:
        ok = 0.0 <= self.discount <= 1.0
        return [] if ok else [f"{p}discount={self.discount} must be in [0, 1] (0: each token's own term)"]


def discounted_sums(values: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """``out_t = sum_{k >= t, mask_k} discount^(masked tokens in (t, k)) values_k`` on masked
    positions, 0 elsewhere; [b, C]. A backwards scan over the columns (masked-out columns carry
    the running sum through unchanged)."""
    mask = mask.bool()
    if discount == 0.0:
        return torch.where(mask, values, 0.0)
    out = torch.zeros_like(values)
    running = values.new_zeros(values.shape[0])
    for t in range(values.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t], values[:, t] + discount * running, running)
        out[:, t] = torch.where(mask[:, t], running, 0.0)
    return out


@register_teacher_objective("reverse_kl", options=ReverseKLOptions)
def reverse_kl_advantages(x: DistillInputs, options: ReverseKLOptions) -> torch.Tensor:
    """``A_t`` above: the per-token advantage ``log nu(y_t) - log pi(y_t)`` (discounted), detached."""
    terms = (x.teacher_logp - x.student_logp).detach()
    return discounted_sums(terms, x.token_mask, options.discount)
