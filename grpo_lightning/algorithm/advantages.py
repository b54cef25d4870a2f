"""Group-relative advantages (GRPO, DeepSeekMath section 4.1.2; Dr. GRPO for ``scale="none"``)."""

from __future__ import annotations

import torch

ADVANTAGE_SCALES = ("group", "batch", "none")


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6
) -> torch.Tensor:
    """Advantage of each completion relative to the other completions of its prompt.

    ``rewards`` has shape [N], laid out group after group (the G completions of prompt 0,
    then those of prompt 1, ...). With ``mu_g`` the mean reward of group g:

    - ``scale="group"``: ``A_i = (r_i - mu_g) / (std_g + eps)`` (GRPO paper),
    - ``scale="batch"``: ``A_i = (r_i - mu_g) / (std_batch + eps)`` (std over all N rewards),
    - ``scale="none"``:  ``A_i = r_i - mu_g`` (Dr. GRPO: no std scaling).

    Standard deviations are unbiased (as TRL and verl compute them). A group of one
    sample, or a group whose rewards are all equal, has advantage exactly 0, never NaN.
    Advantages sum to zero within every group.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must have shape [N], got {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards cannot be split into groups of {group_size}"
        )
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if group_size == 1 or scale == "none":
        # A singleton group is its own mean: centered is already exactly 0.
        return centered.view(-1)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True)
    else:
        std = rewards.float().std() if rewards.numel() > 1 else rewards.new_zeros(())
    # centered is exactly 0 wherever the group std is 0, so the division gives 0, not NaN.
    return (centered / (std + eps)).view(-1)
