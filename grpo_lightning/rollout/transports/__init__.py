"""The built-in weight-sync transports (:data:`grpo_lightning.rollout.transport.TRANSPORTS`):
``memory``, ``folder`` and ``network``; importing this package registers them."""

from grpo_lightning.rollout.transport import TRANSPORTS, WeightReceiver, WeightTransport, make_transport
from grpo_lightning.rollout.transports.folder import FolderTransport, save_weights_folder
from grpo_lightning.rollout.transports.memory import MemoryTransport
from grpo_lightning.rollout.transports.network import NetworkTransport

__all__ = [
    "TRANSPORTS",
    "FolderTransport",
    "MemoryTransport",
    "NetworkTransport",
    "WeightReceiver",
    "WeightTransport",
    "make_transport",
    "save_weights_folder",
]
