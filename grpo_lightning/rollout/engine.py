"""The interface every rollout engine implements, and :data:`ENGINES`, the registry that names them.

An engine is one registered factory ``(policy, tokenizer, cfg) -> RolloutEngine`` (``cfg`` the
whole :class:`~grpo_lightning.config.TrainConfig`); ``rollout.engine=<name>`` picks it, and a
user's file passed with ``plugins=[...]`` can add one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from grpo_lightning.config import RolloutConfig, TrainConfig
from grpo_lightning.errors import ServerError
from grpo_lightning.records import Completion, VisionInputs
from grpo_lightning.registry import Registry


@dataclass(frozen=True)
class Sampling:
    """How one generate call samples. No defaults: the values come from ``rollout.*`` through
    :meth:`from_config` (evaluation derives its greedy and pass@k variants from it)."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0 = off

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> Sampling:
        return cls(rollout.max_new_tokens, rollout.temperature, rollout.top_p, rollout.top_k)


@dataclass
class GenerationRequest:
    """One completion to sample: the prompt's token ids and the seed of its random stream; for a
    prompt with images, its :class:`VisionInputs` (the same object for a group's G requests)."""

    prompt_ids: list[int]
    seed: int
    vision: VisionInputs | None = None


class EngineError(ServerError):
    """An engine failed (a server refused, timed out or died); the message says where and why."""


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples one completion per request, each from the stream its seed names.

    Every method a caller uses is declared here, so callers never probe an engine:
    ``owns_weights`` says whether the engine keeps a copy of the weights of its own (then the
    trainer pushes every update through ``load_weights`` and may verify it with
    ``sequence_logprobs``), ``supports_async`` whether ``generate_async`` runs in the
    background. :class:`EngineBase` gives the defaults of an engine that samples from the
    policy itself.
    """

    owns_weights: bool
    supports_async: bool

    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        """One completion per request: token ids, and (where known) log-probs and weight version per token."""
        ...

    def generate_async(self, requests: list[GenerationRequest], sampling: Sampling) -> Future:
        """``generate`` as a future of its completions."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> float:
        """Replace the engine's weights (an engine that ``owns_weights``); returns the seconds it took."""
        ...

    def sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The engine's log-prob of each completion token after the prompt (temperature 1)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (processes, memory); idempotent."""
        ...


class EngineBase:
    """Defaults for the optional capabilities: no weights of its own, no background generation.

    Subclass it and write ``generate``; an engine with weights of its own sets
    ``owns_weights = True`` and overrides ``load_weights`` and ``sequence_logprobs``.
    """

    owns_weights = False
    supports_async = False

    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        raise NotImplementedError

    def generate_async(self, requests: list[GenerationRequest], sampling: Sampling) -> Future:
        """Runs ``generate`` now; the future is done when it returns."""
        future: Future = Future()
        future.set_result(self.generate(requests, sampling))
        return future

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> float:
        raise EngineError(f"{type(self).__name__} samples from the policy itself: it has no weights to load")

    def sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        raise EngineError(f"{type(self).__name__} does not score sequences (it has no weights of its own)")

    def close(self) -> None:
        """Nothing to release."""


EngineFactory = Callable[[Any, Any, TrainConfig], RolloutEngine]
"""``(policy, tokenizer, cfg) -> engine``: what an entry of :data:`ENGINES` is."""

ENGINES: Registry[EngineFactory] = Registry("rollout engine", "rollout.engine")
