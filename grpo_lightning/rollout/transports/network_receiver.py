"""The vLLM side of the ``network`` transport: a worker extension (``--worker-extension-cls``).

vLLM mixes these methods into its worker; the trainer calls them through the dev-mode
``/collective_rpc`` route with one JSON string argument (the route passes strings only). The
worker joins the trainer's two-member group, receives each planned bucket, and reloads the
weights in place, or (a LoRA adapter) writes the adapter to a folder of the server's own and
returns its path for ``/v1/load_lora_adapter``: a remote server never reads the trainer's disk.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch

from grpo_lightning.rollout.transports.folder import save_adapter_folder
from grpo_lightning.rollout.transports.wire import broadcast, bucket_bytes, open_group, unpack


class NetworkWeightReceiver:
    """Mixed into vLLM's worker; every method name starts with ``grpo_`` to collide with none of vLLM's."""

    def grpo_open_weight_group(self, spec: str) -> str:
        s = json.loads(spec)
        self.grpo_close_weight_group()
        self._grpo_spec = s
        self._grpo_group = open_group(s["backend"], s["host"], s["port"], 1, s["timeout_s"], s["tag"])
        return "joined"

    def grpo_receive_weights(self, spec: str) -> dict:
        """Receive ``plan``'s buckets; reload them as weights, or save them as a LoRA adapter."""
        s = json.loads(spec)
        group = getattr(self, "_grpo_group", None)
        if group is None:
            raise RuntimeError("no weight group: the trainer must call grpo_open_weight_group first")
        device = torch.device("cuda", torch.cuda.current_device()) if self._grpo_spec["backend"] == "nccl" else "cpu"
        received, nbytes = [], 0
        for bucket in s["plan"]:
            flat = torch.empty(sum(bucket_bytes(bucket)), dtype=torch.uint8, device=device)
            broadcast(group, flat, self._grpo_spec["timeout_s"])
            received += unpack(flat, bucket)
            nbytes += flat.numel()
        if s.get("adapter_config") is not None:
            folder = save_adapter_folder(received, s["adapter_config"], tempfile.mkdtemp(prefix="grpo-adapter-"))
            return {"tensors": len(received), "bytes": nbytes, "path": folder}
        self.reload_weights(weights_iterator=received)
        return {"tensors": len(received), "bytes": nbytes}

    def grpo_remove_adapter(self, spec: str) -> str:
        """An adapter the trainer unloaded: remove the folder this worker saved it in."""
        path = json.loads(spec)["path"]
        if os.path.basename(path).startswith("grpo-adapter-"):
            shutil.rmtree(path, ignore_errors=True)
        return "removed"

    def grpo_close_weight_group(self) -> str:
        group = getattr(self, "_grpo_group", None)
        self._grpo_group = None
        if group is not None:
            try:
                group.abort()  # never blocks on a trainer that is gone
            except RuntimeError:
                pass
        return "closed"
