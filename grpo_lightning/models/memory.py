"""A step's peak memory estimated before the model loads, and a run refused up front when it cannot fit.

Without it a batch far too large for the machine is found out only when the first training pass
asks the allocator for it, minutes into the run (and, on CPU, possibly after swapping the machine
to a halt). The estimate counts what is surely alive at the peak of a step: the weights (and the
reference copy for the KL term), gradients and AdamW's two moments, the rollout's KV cache and
sampling logits, the step's whole batch (its per-token tensors, the decoded texts the rewards and
health checks read, the checks' per-sample arrays: linear in the batch, since no check compares
samples pair by pair), and the activations and logits of the largest micro-batch. It counts no
prompt tokens and no allocator overhead, so it errs low: a run it refuses cannot fit;
``trainer.memory_check=false`` skips it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.loading import torch_dtype
from grpo_lightning.models.smollm2 import NAME as SMOLLM2
from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.models.source import model_source
from grpo_lightning.models.tiny import build_char_tokenizer, build_tiny_policy

GIB = 1 << 30
# Bytes per token per layer kept by the training pass beyond the layer input: attention and MLP
# intermediates of one recomputed layer, in units of hidden_size (a rough lower bound).
_LAYER_WORK = 16
# Bytes per completion token of the step's batch: ids and masks (int64), the engine's, the old and the
# reference log-probs (float32), and its decoded text (a few characters per token).
_BATCH_TOKEN_BYTES = 8 + 8 + 4 + 4 + 4 + 4
# Bytes per sequence besides its tokens: its texts' Python objects and the health checks' per-sample arrays.
_SAMPLE_BYTES = 256


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model, read from its config on the meta device (no weights)."""

    params: int
    hidden: int
    layers: int
    vocab: int
    kv_width: int  # key/value heads x head_dim
    bytes_per_param: int


def model_shape(model_cfg) -> Shape:
    """``model.*``'s shape, the model built on the meta device (no memory, no download)."""
    with torch.device("meta"):
        if model_cfg.name_or_path == "tiny":
            t = model_cfg.tiny
            model = build_tiny_policy(build_char_tokenizer(t.alphabet), t.hidden_size, t.num_layers, t.num_heads)
        else:
            name = model_cfg.name_or_path
            config = AutoConfig.from_pretrained(str(ensure_smollm2()) if name == SMOLLM2 else model_source(name))
            model = AutoModelForCausalLM.from_config(config)
    c = model.config
    dtype = torch_dtype(model_cfg.dtype)
    if not isinstance(dtype, torch.dtype):  # auto: the checkpoint's own
        dtype = getattr(c, "torch_dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    heads = getattr(c, "num_attention_heads", 1)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return Shape(
        params=sum(p.numel() for p in model.parameters()),
        hidden=c.hidden_size,
        layers=c.num_hidden_layers,
        vocab=c.vocab_size,
        kv_width=(getattr(c, "num_key_value_heads", None) or heads) * head_dim,
        bytes_per_param=torch.empty((), dtype=dtype).element_size(),
    )


def step_bytes(cfg, shape: Shape) -> dict[str, int]:
    """The estimate's parts in bytes, by what the user can change."""
    r, a, t = cfg.rollout, cfg.algorithm, cfg.trainer
    batch = r.prompts_per_step * r.num_generations
    micro = a.micro_batch(batch)  # width unknown: auto at its fewest sequences, so the estimate errs low
    tokens = r.max_new_tokens  # prompt tokens not counted: the estimate errs low
    w = shape.bytes_per_param
    lora = cfg.model.lora.rank > 0 or cfg.model.lora.config_file is not None
    trainable = 0 if lora else shape.params
    shards = t.devices * t.num_nodes if t.strategy == "fsdp" else 1
    states = shape.params * w * (1 + (a.beta > 0 and not lora)) + trainable * w * 3  # weights, ref, grads, 2 moments
    parts = {"weights and optimizer": states // shards}
    if r.engine == "hf":
        sequences = min(r.generation_batch_size or batch, batch)
        kv_cache = 2 * shape.layers * shape.kv_width * sequences * tokens * w
        parts["rollout KV cache and logits"] = kv_cache + sequences * shape.vocab * 4 * 2  # logits, probabilities
    parts[f"the batch of {batch} sequences (tensors, texts, health checks)"] = batch * (
        tokens * _BATCH_TOKEN_BYTES + _SAMPLE_BYTES
    )
    logits = micro * tokens * shape.vocab * 4
    chunk_mb = a.chunk_mb("cuda" if steps_on_gpu(t.accelerator) else "cpu")
    if chunk_mb > 0:
        logits = min(logits, int(chunk_mb * (1 << 20)))
    activations = micro * tokens * shape.hidden * w * (shape.layers + _LAYER_WORK)
    parts[f"activations and logits of a {micro}-sequence micro-batch"] = activations + logits
    return parts


def steps_on_gpu(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` puts the step on a GPU here."""
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def available_bytes(accelerator: str) -> tuple[int, str]:
    """Free memory where the step runs: this rank's GPU, else the machine's available RAM."""
    if steps_on_gpu(accelerator):
        device = int(os.environ.get("LOCAL_RANK", 0))
        return torch.cuda.mem_get_info(device)[0], f"free on GPU {device}"
    return psutil.virtual_memory().available, "of CPU memory available"


def check_memory(cfg, shape: Shape | None = None, available: tuple[int, str] | None = None) -> None:
    """ConfigError when the estimated peak of one step exceeds the free memory, naming what to lower."""
    if not cfg.trainer.memory_check:
        return
    shape = shape or model_shape(cfg.model)
    parts = step_bytes(cfg, shape)
    free, where = available or available_bytes(cfg.trainer.accelerator)
    total = sum(parts.values())
    if total <= free:
        return
    r, a = cfg.rollout, cfg.algorithm
    said = ", ".join(f"{name} {size / GIB:.1f} GiB" for name, size in parts.items())
    raise ConfigError(
        f"one step needs at least {total / GIB:.1f} GiB ({said}), more than the {free / GIB:.1f} GiB {where}; "
        f"lower algorithm.micro_batch_size={a.micro_batch_size}, rollout.num_generations={r.num_generations}, "
        f"rollout.prompts_per_step={r.prompts_per_step}, rollout.generation_batch_size={r.generation_batch_size} "
        f"or rollout.max_new_tokens={r.max_new_tokens} (or trainer.memory_check=false to try anyway)"
    )
