"""``RolloutBatch``: one generation batch, everything the training step needs and nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from grpo_lightning.rollout.engine import Completion


@dataclass
class RolloutBatch:
    """Prompts x ``group_size`` completions, laid out group after group.

    Prompts are left-padded and completions right-padded, so ``cat([prompt, completion])``
    puts every completion's first token at the same column.
    """

    prompt_ids: torch.Tensor  # [N, P] long
    prompt_mask: torch.Tensor  # [N, P] long
    completion_ids: torch.Tensor  # [N, C] long
    completion_mask: torch.Tensor  # [N, C] long, 1 on sampled tokens (EOS included)
    rewards: torch.Tensor  # [N] float32, the weighted sum over reward functions
    group_size: int
    max_new_tokens: int  # the completion budget: the horizon of seq_mean_token_sum_norm
    temperature: float  # the sampling temperature, applied to the trainer's log-probs too
    step: int = 0
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N]
    finished: torch.Tensor | None = None  # [N] bool, ended with EOS
    engine_logprobs: torch.Tensor | None = None  # [N, C] float32, from the engine
    prompts: list[str] = field(default_factory=list)  # [N] texts
    completions: list[str] = field(default_factory=list)  # [N] texts
    timing: dict[str, float] = field(default_factory=dict)  # rollout/* seconds and tokens/s, logged by the module
    weight_version: int | None = None  # the oldest weight version that sampled the batch (engines with own weights)

    def __post_init__(self) -> None:
        n = self.prompt_ids.shape[0]
        if n % self.group_size:
            raise ValueError(f"{n} sequences do not split into groups of {self.group_size}")
        for name in ("prompt_mask", "completion_ids", "completion_mask", "rewards"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(f"RolloutBatch.{name} has {getattr(self, name).shape[0]} rows, expected {n}")

    @property
    def num_sequences(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_sequences // self.group_size

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        moved["reward_components"] = {k: v.to(device) for k, v in self.reward_components.items()}
        return replace(self, **moved)

    @staticmethod
    def pad_completions(
        completions: list[Completion], pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Right-pad completions into ids, mask, finished flags and (if every one has them) logprobs."""
        width = max(1, max(len(c.token_ids) for c in completions))
        # Padded as Python lists and converted once: a tensor per row costs more than the rows.
        ids = torch.tensor(
            [list(c.token_ids) + [pad_id] * (width - len(c.token_ids)) for c in completions], dtype=torch.long
        )
        mask = torch.tensor(
            [[1] * len(c.token_ids) + [0] * (width - len(c.token_ids)) for c in completions], dtype=torch.long
        )
        has_logprobs = all(c.logprobs is not None for c in completions)
        logprobs = None
        if has_logprobs:
            logprobs = torch.tensor(
                [list(c.logprobs) + [0.0] * (width - len(c.logprobs)) for c in completions], dtype=torch.float32
            )
        finished = torch.tensor([c.finished for c in completions], dtype=torch.bool)
        return ids, mask, finished, logprobs

    @staticmethod
    def pad_prompts(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad prompts into ids and mask."""
        width = max(len(p) for p in prompt_ids)
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompt_ids], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], dtype=torch.long)
        return ids, mask
