"""The interface every rollout engine implements (HF ``generate`` now, vLLM behind it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from grpo_lightning.errors import ServerError


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are sampled; the same for every engine."""

    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off


@dataclass
class GenerationRequest:
    """One completion to sample: the prompt's token ids and the seed of its random stream."""

    prompt_ids: list[int]
    seed: int


@dataclass
class Completion:
    """A sampled completion; ``logprobs`` are the engine's own, if it reports them."""

    token_ids: list[int]
    finished: bool  # ended with EOS (False: cut at max_new_tokens)
    logprobs: list[float] | None = None
    # The weight version (the optimizer step of the last sync) that sampled it, for engines
    # with weights of their own; None for engines that sample from the policy itself.
    weight_version: int | None = None


class EngineError(ServerError):
    """An engine failed (a server refused, timed out or died); the message says where and why."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples one completion per request, each from the stream its seed names."""

    def generate(self, requests: list[GenerationRequest], sampling: SamplingSettings) -> list[Completion]: ...
