"""``model.gradient_checkpointing=auto``: recompute activations only when they would not fit.

Checkpointing costs about a third more compute (a second forward in the backward); TRL
turns it on by default, which on a small model with memory to spare is a third of the
training phase thrown away. Here the step estimates, from its largest micro-batch, the
activations a decoder keeps for the backward and compares them with the memory free on
the device; checkpointing goes on when they would take more than half of it.

The estimate counts, per token and decoder layer, the tensors a Llama-style layer saves:
about ``10 x hidden + 4 x intermediate + 3 x kv_width`` elements, plus a row of attention
probabilities per head (the math attention kernel keeps them; fused kernels keep less, so
this errs towards checkpointing). It is an estimate, stated as one in the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from torch import nn

ACTIVATION_SHARE = 0.5  # checkpoint when activations would take more than this share of free memory


@dataclass(frozen=True)
class CheckpointingChoice:
    """What ``auto`` decided for one step, and why."""

    on: bool
    rows: int
    width: int
    activation_bytes: int
    available_bytes: int

    def report(self) -> str:
        verdict = "on" if self.on else "off"
        relation = "more" if self.on else "less"
        return (
            f"model.gradient_checkpointing=auto: {verdict}. The largest micro-batch ({self.rows} rows x {self.width} "
            f"tokens) keeps about {_size(self.activation_bytes)} of activations without it, {relation} than "
            f"{ACTIVATION_SHARE:.0%} of the {_size(self.available_bytes)} free on the device. "
            "Set model.gradient_checkpointing=true or false to choose yourself."
        )


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def _config_value(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def activation_bytes(model: nn.Module, rows: int, width: int) -> int:
    """Bytes of activations the decoder keeps for the backward of a [rows, width] batch, unrecomputed
    (a vision-language model's: its text decoder's, from its text config)."""
    config = getattr(model.config, "text_config", None) or model.config
    hidden = _config_value(config, "hidden_size", "n_embd", "d_model")
    layers = _config_value(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _config_value(config, "num_attention_heads", "n_head", default=1)
    intermediate = _config_value(config, "intermediate_size", "n_inner", default=4 * hidden)
    kv_heads = _config_value(config, "num_key_value_heads", default=heads)
    kv_width = hidden // heads * kv_heads
    per_token_layer = 10 * hidden + 4 * intermediate + 3 * kv_width + heads * width
    element = next(model.parameters()).element_size()
    return int(rows * width * layers * per_token_layer * element)


def available_bytes(device: torch.device) -> int:
    """Memory free for activations: the accelerator's free memory, or the host's MemAvailable.

    On CUDA that includes what PyTorch's caching allocator holds but no tensor uses: the
    driver counts it as taken, yet the activations will be allocated from it first. Without
    it, the first step's own activations (cached after its backward) made ``auto`` switch
    checkpointing on from the second step of a LoRA Qwen2-0.5B run on an H100, for 24 GiB of
    activations with 71 GiB really free.
    """
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0] + cached)
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(psutil.virtual_memory().available)


def choose_checkpointing(model: nn.Module, rows: int, width: int, device: torch.device) -> CheckpointingChoice:
    """Checkpointing on when the activations of a [rows, width] batch exceed ACTIVATION_SHARE of free memory."""
    needed, free = activation_bytes(model, rows, width), available_bytes(device)
    return CheckpointingChoice(needed > ACTIVATION_SHARE * free, rows, width, needed, free)


def set_checkpointing(model: nn.Module, on: bool) -> None:
    """Turn transformers' gradient checkpointing on (non-reentrant, as at load) or off."""
    if bool(getattr(model, "is_gradient_checkpointing", False)) == on:
        return
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
