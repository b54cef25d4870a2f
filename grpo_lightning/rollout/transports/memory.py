"""``memory``: the engine runs in this process and reads the policy's tensors where they are."""

from __future__ import annotations

from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.transport import TRANSPORTS, WeightReceiver


@TRANSPORTS.register("memory")
class MemoryTransport:
    """No copy: the caller blocks until the reload is done, so the tensors cannot change meanwhile."""

    def push(self, weights: PolicyWeights, engine: WeightReceiver) -> None:
        engine.reload_weights(weights_iterator=list(weights.tensors))
