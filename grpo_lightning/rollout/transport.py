"""Weight-sync transports: how the policy's tensors reach an engine that keeps weights of its own.

A transport is a small class registered in :data:`TRANSPORTS` with one method,
``push(weights, engine)``. It moves :class:`~grpo_lightning.records.PolicyWeights` to where the
engine can read them and asks the engine to reload from there (:class:`WeightReceiver`, vLLM's
``reload_weights`` with ``weights_iterator=`` or ``weights_path=``). The engine picks its default
transport (in memory for vLLM in this process, a safetensors folder for a separate process or a
server, or ``rollout.vllm.sync.transport``: ``network``); a new way of moving weights is one new file under
:mod:`grpo_lightning.rollout.transports`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from grpo_lightning.records import PolicyWeights
from grpo_lightning.registry import Registry


class WeightReceiver(Protocol):
    """What a transport needs of an engine."""

    def reload_weights(self, **source: Any) -> None:
        """Reload from ``weights_iterator=[(name, tensor), ...]`` or ``weights_path=folder``."""
        ...

    def sync_folder(self) -> str:
        """A folder the engine can read that a transport may write weights into."""
        ...


@runtime_checkable
class WeightTransport(Protocol):
    def push(self, weights: PolicyWeights, engine: WeightReceiver) -> None:
        """Move ``weights`` to ``engine`` and have it reload them; returns when it has."""
        ...


def make_transport(name: str, sync_config=None) -> WeightTransport:
    """The transport registered as ``name``; one with ``from_config`` is built from ``rollout.vllm.sync``."""
    cls = TRANSPORTS[name]
    return cls.from_config(sync_config) if sync_config is not None and hasattr(cls, "from_config") else cls()


TRANSPORTS: Registry[type[WeightTransport]] = Registry("weight-sync transport", "rollout.vllm.sync.transport")
