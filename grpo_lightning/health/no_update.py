"""F4: no parameter update. Did the optimizer step actually move the weights?

Before each training step the check copies a fixed sample of every trainable tensor; after
it, the update norm is ``||theta_after - theta_before||`` over that sample. An update of exactly zero
while optimizer steps were taken with lr > 0 and a non-zero gradient means the gradients
were lost before the step (the gradient-accumulation bug). A second signal: the KL to the
reference stuck at exactly zero while beta > 0, although earlier steps had a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import CheckConfig, HealthCheck, register_check
from grpo_lightning.health.view import StepView


class ParameterSnapshot:
    """A flat copy of a fixed strided sample (at most ``per_tensor`` values) of up to 8 trainable
    tensors spread over the model, taken and compared with one ``cat`` each.

    A lost optimizer step leaves every tensor unchanged and a real AdamW step moves every
    tensor that had a gradient, so a sample per tensor tells the two apart at a fraction of
    the cost of copying the model (which would cost more than a small model's whole step).
    """

    MAX_TENSORS = 8  # spread over the model: first, last and evenly between

    def __init__(self, per_tensor: int):
        self.per_tensor = per_tensor
        self.views: list[torch.Tensor] = []
        self.flat: torch.Tensor | None = None
        self.tracked = 0
        self.total = 0

    def _select(self, module: torch.nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        self.total = sum(p.numel() for p in params)
        params = [p for p in params if p.is_contiguous()]  # a strided view needs a flat layout
        if len(params) > self.MAX_TENSORS:
            last = len(params) - 1
            params = [params[round(i * last / (self.MAX_TENSORS - 1))] for i in range(self.MAX_TENSORS)]
        for param in params:
            data = param.detach()
            data = data.to_local() if hasattr(data, "to_local") else data  # FSDP2: this rank's shard
            stride = -(-data.numel() // self.per_tensor) if data.numel() else 1
            view = data.view(-1)[::stride]
            self.views.append(view)
            self.tracked += view.numel()

    @torch.no_grad()
    def take(self, module: torch.nn.Module) -> None:
        if not self.views:
            self._select(module)
        if self.flat is None:
            self.flat = torch.cat(self.views) if self.views else None
        elif self.views:
            torch.cat(self.views, out=self.flat)

    @torch.no_grad()
    def update_norm(self) -> float:
        if self.flat is None:
            return float("nan")
        return float(torch.linalg.vector_norm(torch.cat(self.views) - self.flat))


@dataclass
class NoUpdateCheckConfig(CheckConfig):
    """F4: zero parameter update; KL stuck at exactly zero."""

    min_update_norm: float = option(0.0, "F4: an update norm at or below this (after a step with a gradient) is none.")
    min_grad_norm: float = option(1e-12, "F4: a gradient norm above this counts as 'the loss had a gradient'.")
    tracked_per_tensor: int = option(
        256, "F4: weights sampled (strided) from every trainable tensor and compared before/after each step."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.tracked_per_tensor >= 1, f"{p}tracked_per_tensor={self.tracked_per_tensor} must be >= 1")
        return problems


@register_check(NoUpdateCheckConfig)
class NoUpdateCheck(HealthCheck):
    name = "no_update"
    failure = "F4"
    title = "no parameter update"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.snapshot = ParameterSnapshot(cfg.tracked_per_tensor)
        self._effective_steps = 0  # earlier steps taken with a non-zero gradient

    def before_step(self, policy: torch.nn.Module) -> None:
        self.snapshot.take(policy)

    def measure(self, view: StepView) -> dict[str, float]:
        result = view.result
        finite = [g for g in result.grad_norms if math.isfinite(g)]
        num_taken = len(result.passes) - len(result.skipped)
        last = result.passes[-1] if result.passes else None
        return {
            "taken": float(num_taken),
            "grad_norm": float(max(finite)) if finite and num_taken else 0.0,
            "update_norm": self.snapshot.update_norm(),
            "kl_sum": float(last.kl_sum) if last else 0.0,
            "kl_tokens": float(last.kept_tokens) if last else 0.0,
        }

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        world = view.world_size
        taken, grad, update = t["taken"] / world, t["grad_norm"] / world, t["update_norm"] / world
        metrics = {"update_norm": update}
        problems = []
        if taken > 0 and view.lr > 0 and grad > self.cfg.min_grad_norm and update <= self.cfg.min_update_norm:
            problems.append(
                f"the weights did not change (update norm {update:.3g} over a sample of "
                f"{self.snapshot.tracked} of the {self.snapshot.total} trainable weights) although {taken:.0f} "
                f"optimizer step(s) were taken with lr={view.lr:.3g} and gradient norm {grad:.3g}"
            )
        beta = view.algorithm.beta
        if beta > 0 and t["kl_tokens"] > 0 and t["kl_sum"] == 0.0 and self._effective_steps > 0:
            problems.append(
                f"the KL to the reference is exactly 0 over {t['kl_tokens']:.0f} tokens with beta={beta:g}, "
                f"after {self._effective_steps} earlier step(s) with a non-zero gradient: the policy is still "
                f"identical to its reference"
            )
        if taken > 0 and grad > self.cfg.min_grad_norm:
            self._effective_steps += 1
        if not problems:
            return metrics, None
        return metrics, Finding("; ".join(problems) + ".", {**t, **metrics})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        causes = (
            "the accumulated gradients were lost or zeroed before the optimizer step (a gradient-accumulation "
            "boundary mishandled by a wrapper or engine such as DeepSpeed ZeRO), an optimizer that does not "
            "hold the policy's parameters (built before the model was wrapped or replaced), parameters "
            "frozen by mistake, or an optimizer.step() replaced or skipped by a plugin."
        )
        fix = (
            "check that configure_optimizers receives the parameters that are trained and that nothing calls "
            "zero_grad() between backward and step; try trainer.devices=1 and "
            f"algorithm.micro_batch_size equal to the whole batch (now {view.algorithm.micro_batch_size}) to "
            "rule out accumulation; if you use a custom strategy or precision plugin, try the default one."
        )
        return causes, fix
