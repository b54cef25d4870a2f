"""Per-token estimators of KL(policy || reference) (Schulman, "Approximating KL divergence")."""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_CLAMP = 20.0
K3_OUTPUT_CLAMP = 10.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate from the log-probs of the sampled tokens.

    With ``d = logp - ref_logp`` clamped to [-20, 20] (so every estimator stays finite for
    extreme inputs, -inf included):

    - ``k1 = d`` (unbiased, high variance, can be negative),
    - ``k2 = d^2 / 2`` (biased, low variance, >= 0),
    - ``k3 = exp(-d) + d - 1`` (unbiased, low variance, >= 0; verl's ``low_var_kl``),
      its output clamped to [0, 10] as verl does.

    The gradient flows through ``logp`` only; ``ref_logp`` is treated as a constant.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {KL_ESTIMATORS}, got {kind!r}")
    log_ratio = (logp - ref_logp.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    k3 = torch.exp(-log_ratio) + log_ratio - 1.0
    return k3.clamp(min=0.0, max=K3_OUTPUT_CLAMP)
