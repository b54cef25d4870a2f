"""The tensors an adapter-only weight sync ships: a LoRA policy's adapters, not its merged weights.

A vLLM server started with ``--enable-lora`` keeps the base weights and loads each update as a
new adapter (megabytes instead of the whole model). Weights PEFT trains outside the adapters
(``modules_to_save``: a new head, a resized embedding) would never reach the engine that way,
so such a policy is refused with the fix (merged sync).
"""

from __future__ import annotations

import json

import torch
from torch import nn

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.lora import is_peft_model


def adapter_weights(model: nn.Module) -> tuple[list[tuple[str, torch.Tensor]], dict]:
    """The active adapter's tensors under PEFT's saved names, and its adapter_config.json content."""
    from peft import get_peft_model_state_dict  # noqa: PLC0415  (peft: optional, the lora extra)

    if not is_peft_model(model):
        raise TypeError(f"adapter-only sync needs a peft model (model.lora.*), got {type(model).__name__}")
    config = model.peft_config[model.active_adapter]
    if config.modules_to_save:
        raise ConfigError(
            f"the LoRA config trains modules_to_save={sorted(config.modules_to_save)} besides the adapters: an "
            f"adapter-only sync would never send them to the engine; set rollout.vllm.sync.adapter=merged"
        )
    state = get_peft_model_state_dict(model, adapter_name=model.active_adapter)
    return [(name, tensor.detach()) for name, tensor in state.items()], _json_safe(config.to_dict())


def _json_safe(config: dict) -> dict:
    """adapter_config.json content: sets (target_modules) as sorted lists, enums as their values."""
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set | frozenset) else str(v)))


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's state with every ``lora_B`` zero: merged, it gives the base weights (what a server
    taking adapters must start from, whatever the adapters have learnt, e.g. after a resume)."""
    return {k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in model.state_dict().items()}


def adapter_rank(model: nn.Module) -> int:
    """The rank r of the policy's active adapter (what ``--max-lora-rank`` must cover)."""
    return int(model.peft_config[model.active_adapter].r)
