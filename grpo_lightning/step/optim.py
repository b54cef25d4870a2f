"""The optimizer and learning-rate schedule of the policy's trained weights."""

from __future__ import annotations

import functools

import torch
from torch import nn

from grpo_lightning.algorithm.lr_schedule import lr_factor


def adamw_can_fuse(params: list[torch.Tensor]) -> bool:
    """torch's fused AdamW (one kernel per parameter group: no per-parameter temporaries, a
    faster step; TRL's default) for plain floating-point tensors on CPU or CUDA. FSDP2's
    sharded parameters (DTensors) keep the default implementation."""
    return bool(params) and all(
        type(p) is torch.nn.Parameter and p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params
    )


def build_optimizer(policy: nn.Module, cfg, max_steps: int) -> dict:
    """AdamW over the trained weights (every weight, or the LoRA adapters) and the lr schedule
    (``max_steps`` 0: no decay horizon), as Lightning's ``configure_optimizers`` returns them."""
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trained, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=adamw_can_fuse(trained) or None
    )
    warmup, schedule = max(cfg.warmup_steps, 0), cfg.lr_schedule
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, schedule=schedule, warmup=warmup, total=max_steps)
    )
    return {"optimizer": optimizer, "lr_scheduler": scheduler}
