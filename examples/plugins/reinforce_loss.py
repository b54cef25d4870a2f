"""A policy loss of your own: one registered function, in one file.

    grpo-lightning plugins=[examples/plugins/reinforce_loss.py] algorithm.policy_loss=reinforce

Plain REINFORCE with the group-relative advantage: ``-A * log pi(token)``, no ratio and no clip.
The function returns the per-token loss; the aggregation (``algorithm.loss_agg``, with the
normalizer over the whole generation batch) is applied to every loss alike, so gradient
accumulation stays exact. ``ratio_one_identity=False``: unlike GRPO's surrogate, its value at
ratio 1 is not ``aggregate(-A)`` (it is weighted by the log-probs), so the F5 normalization check
does not test that identity on it.
"""

import torch

from grpo_lightning.algorithm.policy_loss import PolicyLossInputs, PolicyLossOutput, register_policy_loss


@register_policy_loss("reinforce", ratio_one_identity=False)
def reinforce(inputs: PolicyLossInputs, cfg) -> PolicyLossOutput:
    ratio = torch.exp((inputs.logp - inputs.old_logp).detach().clamp(-20.0, 20.0))
    never = torch.zeros_like(inputs.logp, dtype=torch.bool)
    loss = -inputs.advantages[:, None] * inputs.logp
    return PolicyLossOutput(loss=loss, ratio=ratio, clipped_low=never, clipped_high=never, dual_clipped=never)
