"""Adapter-only weight sync to a vLLM server: each update is a new LoRA adapter, not new weights.

With ``model.lora.*`` set (and ``rollout.vllm.sync.adapter=auto``) the server runs with
``--enable-lora`` on the base weights, and each sync loads the adapter's tensors as
``policy-lora-v<version>`` (``POST /v1/load_lora_adapter``; runtime loading needs
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), from a folder the server reads (``folder`` transport) or
one it wrote itself from tensors sent over the network (``network``). Generations then name that
adapter as their model. A fresh name per version means vLLM never serves a stale adapter from a
cache under an old name; the oldest are unloaded so that at most ``slots`` (``max_loras``,
at least max_staleness + 1) stay loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts


@dataclass(frozen=True)
class LoraServing:
    """How a server must start to take the policy's adapters: their rank and how many stay loaded."""

    rank: int
    slots: int

    def server_args(self) -> list[str]:
        max_rank = next((r for r in VLLM_LORA_RANKS if r >= self.rank), None)
        if max_rank is None:
            raise ValueError(f"LoRA rank {self.rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")
        slots = str(self.slots)
        return ["--enable-lora", "--max-lora-rank", str(max_rank), "--max-loras", slots, "--max-cpu-loras", slots]


def adapter_name(version: int) -> str:
    return f"policy-lora-v{version}"


class ServedAdapters:
    """The adapters loaded on the server, oldest first, and where each came from."""

    def __init__(self, slots: int):
        self.slots = slots
        self.loaded: list[tuple[str, str]] = []  # (name, path on the server)

    def load(self, client, transport, weights, engine) -> str:
        """Ship ``weights`` (an adapter) with ``transport`` and have the server load it; returns its name."""
        path = transport.push_adapter(weights, engine)
        name = adapter_name(weights.version)
        client.call(
            "POST",
            "/v1/load_lora_adapter",
            "loading the LoRA adapter",
            json={"lora_name": name, "lora_path": path},
            hint=" (the server needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)",
        )
        self.loaded.append((name, path))
        return name

    def evict(self, client, transport, engine) -> None:
        """Unload the oldest adapters beyond ``slots`` (and remove their folders)."""
        while len(self.loaded) > self.slots:
            name, path = self.loaded.pop(0)
            client.call("POST", "/v1/unload_lora_adapter", "unloading an old LoRA adapter", json={"lora_name": name})
            transport.remove_adapter(path, engine)
