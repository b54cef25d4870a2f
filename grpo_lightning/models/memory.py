"""A step's peak memory estimated before the model loads, and a run refused up front when it cannot fit.

Without it a batch far too large for the machine is found out only when the first training pass
asks the allocator for it, minutes into the run (and, on CPU, possibly after swapping the machine
to a halt). The estimate counts what is surely alive at the peak of a step: the weights (and the
reference copy for the KL term), gradients and AdamW's two moments, the rollout's KV cache and
sampling logits, the step's whole batch (its per-token tensors, the decoded texts the rewards and
health checks read, the checks' per-sample arrays: linear in the batch, since no check compares
samples pair by pair), and the activations and logits of the largest micro-batch; for a
vision-language policy, its image tokens and the vision tower's activations for a micro-batch's
prompts, and for episodes the pictures their environment returns (``task.images_per_episode``, at
most ``rollout.vllm.images_per_prompt``, the runner's limit): each episode's are its own, so the tower
runs on them once per sequence, not once per prompt. It counts no text prompt tokens and no allocator overhead, so it errs low: a run it
refuses cannot fit; ``trainer.memory_check=false`` skips it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace

import psutil
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.loading import torch_dtype
from grpo_lightning.models.smollm2 import NAME as SMOLLM2
from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.models.source import model_source
from grpo_lightning.models.tiny import build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.vision.families import is_vision_config
from grpo_lightning.models.vision.loading import TINY_VLM
from grpo_lightning.models.vision.tiny import build_tiny_vlm, build_vision_tokenizer

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
    # A vision-language policy (0 for text): the tower's width and layers, each image's patches (what the
    # tower computes on) and image tokens (what the language model sees); 0 where the processor decides.
    vision_hidden: int = 0
    vision_layers: int = 0
    patches_per_image: int = 0
    tokens_per_image: int = 0


def model_shape(model_cfg) -> Shape:
    """``model.*``'s shape, the model built on the meta device (no memory, no download)."""
    with torch.device("meta"):
        if model_cfg.name_or_path == "tiny":
            t = model_cfg.tiny
            model = build_tiny_policy(build_char_tokenizer(t.alphabet), t.hidden_size, t.num_layers, t.num_heads)
        elif model_cfg.name_or_path == TINY_VLM:
            v = model_cfg.tiny_vlm
            tokenizer = build_vision_tokenizer(v.family)
            args = (v.family, v.hidden_size, v.num_layers, v.num_heads, v.vision_layers, v.image_size, v.patch_size)
            model, _ = build_tiny_vlm(tokenizer, *args)
        else:
            name = model_cfg.name_or_path
            config = AutoConfig.from_pretrained(str(ensure_smollm2()) if name == SMOLLM2 else model_source(name))
            auto = AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM
            model = auto.from_config(config)
    vision = vision_shape(model.config)
    c = getattr(model.config, "text_config", None) or model.config
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
        **vision,
    )


def vision_shape(config) -> dict[str, int]:
    """A VLM config's vision tower: width, layers, patches and image tokens per image (where fixed)."""
    v = getattr(config, "vision_config", None)
    if v is None:
        return {}
    width = getattr(v, "hidden_size", None) or getattr(v, "embed_dim", 0)
    layers = getattr(v, "num_hidden_layers", None) or getattr(v, "depth", 0)
    side, patch = getattr(v, "image_size", 0), getattr(v, "patch_size", 1)
    patches = (side // patch) ** 2 if side else 0  # fixed-size towers (CLIP, SigLIP); 0: the processor decides
    return {"vision_hidden": width, "vision_layers": layers, "patches_per_image": patches, "tokens_per_image": patches}


def environment_images(cfg) -> int:
    """Pictures an episode's environment returns at most: its task's ``images_per_episode`` (0 for a
    single-turn task, or an environment that declares none), capped at ``rollout.vllm.images_per_prompt``
    (the runner ends the run beyond it: environments/images.py)."""
    declared = getattr(cfg.task.promoted(), "images_per_episode", 0) or 0
    return min(int(declared), cfg.rollout.vllm.images_per_prompt)


def step_bytes(cfg, shape: Shape, images_per_prompt: int = 0) -> dict[str, int]:
    """The estimate's parts in bytes, by what the user can change (``images_per_prompt``: the most a
    prompt of the data carries; an environment's pictures are read from ``cfg``: :func:`environment_images`)."""
    r, a, t = cfg.rollout, cfg.algorithm, cfg.trainer
    batch = r.prompts_per_step * r.num_generations
    micro = a.micro_batch(batch)  # width unknown: auto at its fewest sequences, so the estimate errs low
    episode_images = environment_images(cfg)
    # Text prompt tokens not counted (the estimate errs low); a prompt's and an episode's image tokens are.
    tokens = r.max_new_tokens + (images_per_prompt + episode_images) * shape.tokens_per_image
    w = shape.bytes_per_param
    lora = cfg.model.lora.rank > 0 or cfg.model.lora.config_file is not None
    trainable = 0 if lora else shape.params
    shards = t.devices * t.num_nodes if t.strategy == "fsdp" else 1
    states = shape.params * w * (1 + (a.beta > 0 and not lora)) + trainable * w * 3  # weights, ref, grads, 2 moments
    parts = {"weights and optimizer": states // shards}
    teacher = teacher_weights(cfg, shape, lora)
    if teacher:
        parts["teacher weights"] = teacher
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
    if (images_per_prompt or episode_images) and shape.vision_hidden:
        # The tower runs on a prompt's images once per distinct prompt of a micro-batch, on an episode's
        # pictures once per sequence (each episode's are its own objects, even where they look alike).
        prompts = -(-micro // r.num_generations)
        patches = (prompts * images_per_prompt + micro * episode_images) * shape.patches_per_image
        parts["vision tower activations"] = patches * shape.vision_hidden * w * (shape.vision_layers + _LAYER_WORK)
    return parts


def teacher_weights(cfg, shape: Shape, lora: bool) -> int:
    """Bytes of a distillation teacher's weights on the step's device: a third model beside the policy and
    the reference (a teacher folder), or a frozen copy of the policy (context distillation without a
    reference or LoRA to share); a LoRA base, a server, a teacher on its own device: none here."""
    t = getattr(cfg.algorithm, "teacher", None)
    if t is None or not t.active or t.device != "auto":
        return 0
    kind = t.resolved_kind()
    if kind == "context" and cfg.algorithm.beta == 0 and not lora:
        return shape.params * shape.bytes_per_param
    if kind == "folder":
        their = model_shape(SimpleNamespace(name_or_path=t.path, dtype=t.dtype, tiny=cfg.model.tiny))
        return their.params * their.bytes_per_param
    return 0


def steps_on_gpu(accelerator: str) -> bool:
    """Whether ``trainer.accelerator`` puts the step on a GPU here."""
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def available_bytes(accelerator: str) -> tuple[int, str]:
    """Free memory where the step runs: this rank's GPU, else the machine's available RAM."""
    if steps_on_gpu(accelerator):
        device = int(os.environ.get("LOCAL_RANK", 0))
        return torch.cuda.mem_get_info(device)[0], f"free on GPU {device}"
    return psutil.virtual_memory().available, "of CPU memory available"


def check_memory(
    cfg, shape: Shape | None = None, available: tuple[int, str] | None = None, images_per_prompt: int = 0
) -> None:
    """ConfigError when the estimated peak of one step exceeds the free memory, naming what to lower."""
    if not cfg.trainer.memory_check:
        return
    shape = shape or model_shape(cfg.model)
    parts = step_bytes(cfg, shape, images_per_prompt)
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
