"""Per-token estimators of KL(policy || reference) (Schulman, "Approximating KL divergence").

Each estimator is registered by name in :data:`KL_ESTIMATORS` (``algorithm.kl_estimator``
selects one); a new one is one decorated function of the clamped log-ratio.
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


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate from the log-probs of the sampled tokens: the estimator ``kind``
    applied to ``d = logp - ref_logp`` clamped to [-20, 20] (so every estimator stays finite for
    extreme inputs, -inf included).

    The gradient flows through ``logp`` only; ``ref_logp`` is treated as a constant.
    """
    estimator = KL_ESTIMATORS[kind]
    return estimator((logp - ref_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
