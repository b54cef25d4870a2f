"""The records a rollout produces: an engine's :class:`Completion` and the generation batch
(:class:`RolloutBatch`) the step trains on.

The records carry what multi-turn episodes and off-policy corrections need: a loss mask separate
from the attention mask (environment tokens are attended to but not trained on), the engine's
log-prob and weight version of every token, episode and turn ids, and a variable-length view
(:class:`~grpo_lightning.records.varlen.VarLen`) of the padded tensors. Imports only torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from grpo_lightning.records.varlen import VarLen
from grpo_lightning.records.vision import VisionInputs, moved


@dataclass
class Completion:
    """A sampled completion as an engine returns it; ``logprobs`` are the engine's own, if it reports them.

    A multi-turn episode is one completion whose ``token_ids`` interleave the model's turns
    and the environment's messages: ``loss_mask`` is 0 on the environment's tokens, and
    ``turn_ids`` says which turn each token belongs to. Per-token lists are as long as ``token_ids``.
    """

    token_ids: list[int]
    finished: bool  # ended with EOS (False: cut at max_new_tokens)
    logprobs: list[float] | None = None
    # The weight version (the optimizer step of the last sync) that sampled it, for engines
    # with weights of their own; None for engines that sample from the policy itself.
    weight_version: int | None = None
    token_weight_versions: list[int] | None = None  # per token, where the versions differ (partial rollouts)
    loss_mask: list[int] | None = None  # per token; None: every token was sampled by the model
    turn_ids: list[int] | None = None  # per token; None: a single turn

    def __post_init__(self) -> None:
        for name in ("logprobs", "token_weight_versions", "loss_mask", "turn_ids"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.token_ids):
                raise ValueError(f"Completion.{name} has {len(values)} entries for {len(self.token_ids)} tokens")

    def versions(self) -> list[int] | None:
        """The weight version of every token, or None where the engine samples from the policy itself."""
        if self.token_weight_versions is not None:
            return list(self.token_weight_versions)
        return None if self.weight_version is None else [self.weight_version] * len(self.token_ids)


# Per-token [N, C] fields of a RolloutBatch besides the ids, each optional.
TOKEN_FIELDS = ("completion_mask", "engine_logprobs", "loss_mask", "token_weight_versions", "turn_ids")


@dataclass
class RolloutBatch:
    """Prompts x ``group_size`` completions, laid out group after group.

    Prompts are left-padded and completions right-padded, so ``cat([prompt, completion])``
    puts every completion's first token at the same column. ``completion_mask`` is the
    attention mask of the completion side (1 on every real token); ``loss_mask`` (if given)
    marks the tokens the model sampled and the loss counts: 0 on an environment's messages
    inside a multi-turn episode. :meth:`completion_layout` and :meth:`sequences` give the
    same tokens without padding.
    """

    prompt_ids: torch.Tensor  # [N, P] long
    prompt_mask: torch.Tensor  # [N, P] long
    completion_ids: torch.Tensor  # [N, C] long
    completion_mask: torch.Tensor  # [N, C] long, 1 on real tokens (sampled ones, EOS included, and environment ones)
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
    sources: list[str] = field(default_factory=list)  # [N] each row's data_source (task=mixed); empty: one source
    timing: dict[str, float] = field(default_factory=dict)  # rollout/* seconds and tokens/s, logged by the module
    weight_version: int | None = None  # the oldest weight version that sampled the batch (engines with own weights)
    loss_mask: torch.Tensor | None = None  # [N, C] long; None: the completion_mask (every real token was sampled)
    token_weight_versions: torch.Tensor | None = None  # [N, C] long, the version that sampled each token (-1: none)
    episode_ids: torch.Tensor | None = None  # [N] long; None: every row is an episode of its own
    turn_ids: torch.Tensor | None = None  # [N, C] long, each token's turn in its episode (-1 on padding)
    reward_metrics: dict[str, float] = field(default_factory=dict)  # reward/<name>: what rewards gave log_metric
    reward_extra: dict[str, list] = field(default_factory=dict)  # column -> [N]: what rewards gave log_extra
    episodes: list[dict] = field(default_factory=list)  # [N] an episode's turns, stop reason, tools (plain data)
    episode_limits: dict = field(default_factory=dict)  # an episode task's limits (max_turns, context, ...)
    # [N] each sequence's prompt images (records/vision.py; a group's rows share one object); None: text only
    vision: list[VisionInputs | None] | None = None

    def __post_init__(self) -> None:
        n = self.prompt_ids.shape[0]
        if n % self.group_size:
            raise ValueError(f"{n} sequences do not split into groups of {self.group_size}")
        for name in ("prompt_mask", "completion_ids", "completion_mask", "rewards", "episode_ids"):
            value = getattr(self, name)
            if value is not None and value.shape[0] != n:
                raise ValueError(f"RolloutBatch.{name} has {value.shape[0]} rows, expected {n}")
        for name in TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and value.shape != self.completion_ids.shape:
                raise ValueError(
                    f"RolloutBatch.{name} has shape {tuple(value.shape)}, expected {tuple(self.completion_ids.shape)}"
                )
        if self.vision is not None and len(self.vision) != n:
            raise ValueError(f"RolloutBatch.vision has {len(self.vision)} entries, expected {n}")
        if self.loss_mask is not None and bool((self.loss_mask.bool() & ~self.completion_mask.bool()).any()):
            raise ValueError("RolloutBatch.loss_mask marks a padding token (outside completion_mask)")

    @property
    def num_sequences(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_sequences // self.group_size

    @property
    def used_width(self) -> int:
        """Columns a micro-batch of every row keeps once all-padding columns are trimmed: the
        longest prompt plus the longest completion (prompts are left-padded, completions right)."""
        return int(self.prompt_mask.any(dim=0).sum()) + int(self.completion_mask.any(dim=0).sum())

    @property
    def trained_mask(self) -> torch.Tensor:
        """[N, C] the tokens the loss counts: ``loss_mask`` if given, else ``completion_mask`` (itself)."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved_fields = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        moved_fields["reward_components"] = {k: v.to(device) for k, v in self.reward_components.items()}
        moved_fields["vision"] = moved(self.vision, device)
        return replace(self, **moved_fields)

    # ----------------------------------------------------------------------- variable-length views
    def completion_layout(self, name: str = "completion_ids") -> VarLen:
        """A per-token field (``completion_ids`` or one of ``TOKEN_FIELDS``) without padding."""
        values = self.completion_ids if name == "completion_ids" else getattr(self, name)
        if values is None:
            raise ValueError(f"RolloutBatch.{name} is not set")
        return VarLen.from_padded(values, self.completion_mask)

    def sequences(self) -> tuple[VarLen, torch.Tensor]:
        """Every sequence's real tokens (prompt then completion) without padding, and each one's prompt length."""
        ids = torch.cat([self.prompt_ids, self.completion_ids], dim=1)
        mask = torch.cat([self.prompt_mask, self.completion_mask], dim=1)
        return VarLen.from_padded(ids, mask), self.prompt_mask.sum(dim=1)

    # ----------------------------------------------------------------------- assembling
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
    def pad_token_fields(completions: list[Completion]) -> dict[str, torch.Tensor]:
        """The optional per-token fields (``loss_mask``, ``token_weight_versions``, ``turn_ids``) that any
        completion carries, right-padded like :meth:`pad_completions` (0 or -1 on padding)."""
        width = max(1, max(len(c.token_ids) for c in completions))
        per_token = {
            "loss_mask": [c.loss_mask for c in completions],
            "token_weight_versions": [c.versions() for c in completions],
            "turn_ids": [c.turn_ids for c in completions],
        }
        # (the value of a completion that does not say, the padding)
        defaults = {"loss_mask": (1, 0), "token_weight_versions": (-1, -1), "turn_ids": (0, -1)}
        out = {}
        for name, rows in per_token.items():
            if all(row is None for row in rows):
                continue
            value, pad = defaults[name]
            rows = [
                row if row is not None else [value] * len(c.token_ids) for row, c in zip(rows, completions, strict=True)
            ]
            out[name] = torch.tensor([list(row) + [pad] * (width - len(row)) for row in rows], dtype=torch.long)
        return out

    @staticmethod
    def pad_prompts(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad prompts into ids and mask."""
        width = max(len(p) for p in prompt_ids)
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompt_ids], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], dtype=torch.long)
        return ids, mask
