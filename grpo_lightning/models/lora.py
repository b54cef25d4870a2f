"""LoRA adapters through ``peft``: wrapping the policy, its reference, merged weights, export.

* :func:`apply_lora` wraps a loaded policy in peft's LoRA (``model.lora.*`` or a PEFT config
  file). Only the adapters train; the adapters stay float32 when the base weights are
  bfloat16 / float16 (peft's ``autocast_adapter_dtype``).
* :class:`AdapterDisabledReference` is the reference model of a LoRA policy: the same base
  weights with the adapters switched off (``disable_adapter()``), so beta > 0 costs no second
  copy of the weights.
* :func:`merged_state_dict` gives the weights an engine with weights of its own (vLLM) needs:
  plain Hugging Face names, ``W + scale * B @ A`` for every adapted layer, computed out of
  place. The policy is never merged and unmerged, so its base weights never drift (merging
  and unmerging a bfloat16 weight in place does not give back the same bits).
* :func:`save_adapter` and :func:`save_merged` write the adapter folder (loads with
  ``PeftModel.from_pretrained``) and a merged folder that loads with plain transformers; the
  merged weights go into the file one at a time (:mod:`grpo_lightning.models.weight_files`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from grpo_lightning.models.vision.processor import saved_with
from grpo_lightning.models.weight_files import overwrite_tensors

if TYPE_CHECKING:
    from grpo_lightning.config import LoraModelConfig

# peft's own value: every nn.Linear but the output head, i.e. the attention and MLP
# projections of a decoder (q, k, v, o, gate, up, down on Llama / Qwen / SmolLM2).
DEFAULT_TARGETS = "all-linear"
_BASE = ".base_layer."


def lora_enabled(cfg: LoraModelConfig) -> bool:
    return cfg.rank > 0 or cfg.config_file is not None


def peft_config(cfg: LoraModelConfig, default_targets: list[str] | None = None):
    """The ``peft.LoraConfig`` of ``model.lora``: from its config file, or rank / alpha / dropout / targets
    (``default_targets`` where ``target_modules`` is empty: peft's all-linear if None)."""
    from peft import LoraConfig, PeftConfig  # noqa: PLC0415  (peft: optional, the lora extra)

    if cfg.config_file is not None:
        path = Path(cfg.config_file).expanduser()
        folder = path.parent if path.is_file() else path
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"model.lora.config_file={cfg.config_file!r}: no adapter_config.json there; pass a PEFT "
                f"adapter_config.json (or its folder), or set model.lora.rank instead"
            )
        config = PeftConfig.from_pretrained(str(folder))
        if not isinstance(config, LoraConfig):
            raise ValueError(
                f"model.lora.config_file={cfg.config_file!r} holds a {type(config).__name__}; only LoRA "
                f"configs are supported (peft_type LORA)"
            )
        if getattr(config, "use_dora", False):
            raise ValueError(
                f"model.lora.config_file={cfg.config_file!r} sets use_dora=true; DoRA's merged weights are not "
                f"W + B @ A, which the engine sync and the merged export assume: set use_dora=false"
            )
        config.inference_mode = False
        return config
    return LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules) or default_targets or DEFAULT_TARGETS,
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: nn.Module, cfg: LoraModelConfig, default_targets: list[str] | None = None) -> nn.Module:
    """``model`` wrapped in LoRA adapters (a ``PeftModelForCausalLM``); only the adapters train
    (``default_targets``: the layers adapted when ``model.lora.target_modules`` is empty)."""
    try:
        from peft import get_peft_model  # noqa: PLC0415  (peft: optional, the lora extra)
    except ImportError as err:
        raise ImportError(
            "model.lora needs the peft package: pip install 'grpo_lightning[lora]' (or pip install peft)"
        ) from err
    return get_peft_model(model, peft_config(cfg, default_targets), autocast_adapter_dtype=True)


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a peft model with adapters that can be switched off."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model") and hasattr(model, "peft_config")


class AdapterDisabledReference:
    """The reference model of a LoRA policy: the policy itself with its adapters switched off.

    Not an ``nn.Module`` on purpose: it owns no weights, so Lightning neither moves, counts,
    saves nor shards anything twice. :meth:`active` yields the model to run in its place.
    """

    def __init__(self, policy: nn.Module):
        if not is_peft_model(policy):
            raise TypeError(f"AdapterDisabledReference needs a peft model, got {type(policy).__name__}")
        self.policy = policy

    @contextmanager
    def active(self) -> Iterator[nn.Module]:
        """The base model for the duration of the block (adapters off, eval mode), then as it was."""
        was_training = self.policy.training
        self.policy.eval()
        try:
            with self.policy.disable_adapter():
                yield self.policy
        finally:
            self.policy.train(was_training)

    # What GRPOModule asks of a frozen reference model.
    def eval(self) -> AdapterDisabledReference:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> AdapterDisabledReference:
        return self

    def parameters(self) -> Iterator[nn.Parameter]:
        return iter(())


@contextmanager
def reference_model(reference) -> Iterator[nn.Module]:
    """The model to compute reference log-probs with: ``reference`` itself, or a LoRA policy's base."""
    if isinstance(reference, AdapterDisabledReference):
        with reference.active() as model:
            yield model
    else:
        yield reference


def _adapted_layers(base: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer  # noqa: PLC0415  (peft: optional, the lora extra)

    return {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}


_PEFT_PREFIX = "base_model.model."


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with FSDP2 shards gathered into whole tensors.

    Under ``trainer.strategy=fsdp`` this is a collective: every rank must call it.
    """
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}


@torch.no_grad()
def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The weights with the active adapters merged in, under the base model's plain HF names.

    Out of place: every adapted weight is a new tensor ``W + delta`` (in W's dtype, the sum
    taken in float32), the others are the policy's own tensors. ``state`` is the model's
    state dict to merge (e.g. :func:`full_state_dict` of a sharded policy); by default its own.
    Without adapters it is that state dict.
    """
    if not is_peft_model(model):
        return state if state is not None else model.state_dict()
    return {name: merge() if merge is not None else tensor for name, tensor, merge in _plain_weights(model, state)}


def _plain_weights(model: nn.Module, state: dict[str, torch.Tensor] | None):
    """(plain HF name, the base tensor, a function making its merged tensor or None) for each weight of
    a peft policy (the adapters' own tensors left out)."""
    base = model.get_base_model()
    if state is None:
        state = base.state_dict()
    else:
        state = {k.removeprefix(_PEFT_PREFIX): v for k, v in state.items()}
    layers = _adapted_layers(base)
    for key, tensor in state.items():
        if _BASE not in key:
            if ".lora_" not in key:
                yield key, tensor, None
            continue
        owner, leaf = key.split(_BASE, 1)
        layer = layers.get(owner)
        merge = None
        if leaf == "weight" and layer is not None:
            merge = partial(_merged_weight, layer, tensor, state, owner)
        yield f"{owner}.{leaf}", tensor, merge


def _merged_weight(layer: nn.Module, weight: torch.Tensor, state: dict, owner: str) -> torch.Tensor:
    """``W + sum over active adapters of scale * B @ A`` as a new tensor in W's dtype (float32 sums)."""
    merged = weight.float().clone() if weight.dtype != torch.float32 else None
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        plain = (
            isinstance(layer.lora_A[name], nn.Linear)
            and not getattr(layer, "fan_in_fan_out", False)
            and not layer.use_dora.get(name, False)
        )
        base = merged if merged is not None else weight
        if plain:  # one fused matmul-add, no separate delta tensor
            a = state.get(f"{owner}.lora_A.{name}.weight", layer.lora_A[name].weight).float()
            b = state.get(f"{owner}.lora_B.{name}.weight", layer.lora_B[name].weight).float()
            merged = torch.addmm(base, b, a, alpha=layer.scaling[name])
        else:  # peft's own delta (embeddings, convolutions, fan-in-fan-out layers)
            merged = base + layer.get_delta_weight(name).float()
    if merged is None:
        return weight
    return merged.to(weight.dtype) if merged.dtype != weight.dtype else merged


def engine_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What a weight sync pushes into an engine: the merged weights of a LoRA policy, else its state dict."""
    return iter(merged_state_dict(model).items())  # made now: the sync's merge time is measured here


def save_adapter(model: nn.Module, folder: str | Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """The adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) of a LoRA policy
    (``state``: its :func:`full_state_dict` when sharded)."""
    if not is_peft_model(model):
        raise TypeError(f"save_adapter needs a peft model (model.lora.rank > 0), got {type(model).__name__}")
    folder = Path(folder)
    extra = {"state_dict": state} if state is not None else {}
    model.save_pretrained(str(folder), safe_serialization=True, **extra)
    return folder


def save_merged(
    model: nn.Module, folder: str | Path, tokenizer=None, state: dict[str, torch.Tensor] | None = None
) -> Path:
    """A plain Hugging Face folder of the policy with its adapters merged in.

    Loads with ``AutoModelForCausalLM.from_pretrained`` alone (no peft), in vLLM too. The
    policy itself is left untouched. ``state``: the policy's :func:`full_state_dict` when sharded.
    """
    folder = Path(folder)
    base = model.get_base_model() if is_peft_model(model) else model
    if is_peft_model(model):
        _save_merged_in_place(model, base, folder, state)
    elif state is not None:
        base.save_pretrained(str(folder), state_dict=state, safe_serialization=True)
    else:
        base.save_pretrained(str(folder), safe_serialization=True)
    _plain_architectures(folder)
    if tokenizer is not None:
        saved_with(tokenizer).save_pretrained(str(folder))  # a VLM's processor, with its tokenizer
    return folder


@torch.no_grad()
def _save_merged_in_place(model: nn.Module, base: nn.Module, folder: Path, state: dict | None) -> None:
    """transformers writes the unmerged weights under their plain names (its tied weights, shards and
    names), then each merged weight is made and written over its own bytes, one at a time: no second
    copy of the adapted weights (most of the model) at the end of a run. Where transformers wrote a
    weight differently (renamed, converted), the folder is written again from the whole merged dict."""
    plain = list(_plain_weights(model, state))
    base.save_pretrained(str(folder), state_dict={n: t for n, t, _ in plain}, safe_serialization=True)
    merges = {n: (t, merge) for n, t, merge in plain if merge is not None}
    if not overwrite_tensors(folder, merges):
        del plain, merges
        base.save_pretrained(str(folder), state_dict=merged_state_dict(model, state), safe_serialization=True)


def _plain_architectures(folder: Path) -> None:
    """FSDP2 swaps a sharded model's class for ``FSDP<Class>``, which ``save_pretrained`` writes
    into ``config.json``; vLLM picks the model class from that name: write the plain one."""
    path = folder / "config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    names = config.get("architectures") or []
    if any(n.startswith("FSDP") for n in names):
        config["architectures"] = [n.removeprefix("FSDP") for n in names]
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
