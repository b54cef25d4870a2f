"""The built-in weight-sync transports (:data:`grpo_lightning.rollout.transport.TRANSPORTS`):
``memory`` and ``folder``; importing this package registers them."""

from grpo_lightning.rollout.transport import TRANSPORTS, WeightReceiver, WeightTransport
from grpo_lightning.rollout.transports.folder import FolderTransport, save_weights_folder
from grpo_lightning.rollout.transports.memory import MemoryTransport

__all__ = [
    "TRANSPORTS",
    "FolderTransport",
    "MemoryTransport",
    "WeightReceiver",
    "WeightTransport",
    "save_weights_folder",
]
