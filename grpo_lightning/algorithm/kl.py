"""Per-token estimators of KL(policy || reference) (Schulman, "Approximating KL divergence").

Each estimator is registered by name in :data:`KL_ESTIMATORS` (``algorithm.kl_estimator``
selects one); a new one is one decorated function of the clamped log-ratio.

**The gradient.** The tokens are sampled from the policy, so the gradient of an estimate is not
the gradient of its expectation: k3's, ``(1 - ref / pi) grad log pi``, averages to the gradient
of the *forward* KL(ref || policy), whose pull on a token the policy has made likely is bounded
(by 1, however far above the reference it is), k1's averages to 0, and k3's clamp cuts it off
where the policy fell far below the reference. :func:`ratio_weighted` gives the term the value
``estimate x pi / pi_old`` (the ratio is 1 in value on the first pass) and the gradient
``log(pi / ref) x pi / pi_old x grad log pi``, that of the reverse KL(policy || ref) the loss
reports, whatever the estimator (``algorithm.kl_bias_correction``; TRL's
``use_bias_correction_kl``, which multiplies its unclamped k3 by the ratio, has that gradient too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_lightning.registry import Registry

LOG_RATIO_CLAMP = 20.0
K3_OUTPUT_CLAMP = 10.0

KlEstimatorFn = Callable[[torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KlEstimatorFn] = Registry("KL estimator", "algorithm.kl_estimator")


@KL_ESTIMATORS.register("k1")
def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """``d`` (unbiased, high variance, can be negative)."""
    return log_ratio


@KL_ESTIMATORS.register("k2")
def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """``d^2 / 2`` (biased, low variance, >= 0)."""
    return 0.5 * log_ratio.square()


@KL_ESTIMATORS.register("k3")
def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(-d) + d - 1`` (unbiased, low variance, >= 0; verl's ``low_var_kl``), clamped to [0, 10] as verl does."""
    return (torch.exp(-log_ratio) + log_ratio - 1.0).clamp(min=0.0, max=K3_OUTPUT_CLAMP)


def ratio_weighted(
    kl: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor
) -> torch.Tensor:
    """Value ``kl x pi / pi_old``, gradient ``log(pi / ref) x pi / pi_old x grad log pi`` per token (the
    log-ratios clamped to [-20, 20]: padding and dropped rows stay finite, and the gradient bounded)."""
    ratio = torch.exp((logp - old_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    log_ratio = (logp - ref_logp).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (kl * ratio).detach() + log_ratio * (ratio - ratio.detach())


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate from the log-probs of the sampled tokens: the estimator ``kind``
    applied to ``d = logp - ref_logp`` clamped to [-20, 20] (so every estimator stays finite for
    extreme inputs, -inf included).

    The gradient flows through ``logp`` only; ``ref_logp`` is treated as a constant.
    """
    estimator = KL_ESTIMATORS[kind]
    return estimator((logp - ref_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
