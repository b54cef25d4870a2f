"""``folder``: the policy's tensors go through a safetensors file the engine's process reads
(a vLLM engine out of this process, a vLLM server on this host or a shared file system)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors.torch import save_file

from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.transport import TRANSPORTS, WeightReceiver


def save_weights_folder(named_tensors, folder: str) -> str:
    """Write ``named_tensors`` as ``folder/model.safetensors`` for vLLM to reload.

    Tensors that share memory (tied input and output embeddings, as in SmolLM2) are written
    as copies: safetensors refuses shared tensors, and vLLM reads each name it needs.
    """
    seen: set[int] = set()
    tensors = {}
    for name, tensor in named_tensors:
        tensor = tensor.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    Path(folder).mkdir(parents=True, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    return folder


def save_adapter_folder(named_tensors, adapter_config: dict, folder: str) -> str:
    """A PEFT adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``) vLLM can load."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    save_file(
        {n: t.detach().cpu().contiguous() for n, t in named_tensors}, os.path.join(folder, "adapter_model.safetensors")
    )
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f)
    return folder


@TRANSPORTS.register("folder")
class FolderTransport:
    """Writes the weights into the engine's :meth:`sync_folder`, then has it reload from there."""

    def push(self, weights: PolicyWeights, engine: WeightReceiver) -> None:
        engine.reload_weights(weights_path=save_weights_folder(weights.tensors, engine.sync_folder()))

    def push_adapter(self, weights: PolicyWeights, engine) -> str:
        """Write a LoRA adapter beside the weights; returns the path the server loads it from."""
        folder = os.path.join(engine.sync_folder(), f"adapter-v{weights.version}")
        return save_adapter_folder(weights.tensors, weights.adapter_config, folder)

    def remove_adapter(self, path: str, engine) -> None:
        """An adapter the server unloaded: its folder goes too."""
        shutil.rmtree(path, ignore_errors=True)
